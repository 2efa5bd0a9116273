"""The paper's H/h gradient rescale: what it does to the gradients, and when it matters.

`Tuned.rescale_grads` multiplies the delta gradients of a layer by H / (heads trained in it). AdamW
normalises each coordinate by its own gradient scale, so without clipping or weight decay (and with
a negligible eps) the rescale changes nothing; plain SGD, or AdamW whose global clipping couples
the layers, sees it.
"""
import pytest
import torch

from keyheads.components import Components
from keyheads.finetune.data import collate, n_loss_tokens, tokenize
from keyheads.finetune.model import precise
from keyheads.finetune.settings import FinetuneSettings
from keyheads.finetune.train import completion_loss_sum, train
from keyheads.testing import tiny_model

pytestmark = pytest.mark.slow  # optimizer steps on a tiny model, about 10 s in all

# Two heads of layer 1 (scale 4/2) and one of layer 2 (scale 4/1).
HEADS = ((1, 0), (1, 1), (2, 3))


def _run(examples, tmp_path, name, **settings):
    """Train precise deltas on a fresh float64 tiny model; return {delta key: (weight, bias)}."""
    model = tiny_model("qwen2", seed=2, dtype=torch.float64)  # Q/K/V biases: they are rescaled too
    data = tokenize(model.tokenizer, examples, 1024)
    base = dict(lr=1e-2, optimizer_batch_size=8, micro_batch_size=8, max_steps=4, warmup_ratio=0.0, weight_decay=0.0,
                max_grad_norm=0.0, save_every=0)
    cfg = FinetuneSettings(**{**base, **settings})
    tuned = precise(model, Components(HEADS, ()))
    train(tuned, data, cfg, tmp_path / name, {}, progress=False)
    return {k: [p.detach().clone() for p in d.parameters()] for k, d in tuned.deltas.items()}


def _rel_diff(a, b):
    """Largest relative difference over all delta tensors, and the smallest trained tensor's size."""
    worst, smallest = 0.0, float("inf")
    for key in a:
        for x, y in zip(a[key], b[key]):
            scale = max(x.abs().max().item(), y.abs().max().item())
            smallest = min(smallest, scale)
            worst = max(worst, (x - y).abs().max().item() / scale)
    return worst, smallest


def test_rescale_grads_multiplies_each_layer_by_heads_over_trained(examples):
    model = tiny_model("gpt_neox", seed=0, dtype=torch.float64)  # fused, interleaved QKV
    # Layer 0: 3 of 4 heads (4/3); layer 1: 1 head (4); layer 2: all 4 (1). Plus the MLP of layer 1.
    heads = ((0, 0), (0, 1), (0, 2), (1, 2), (2, 0), (2, 1), (2, 2), (2, 3))
    expected = {0: 4 / 3, 1: 4.0, 2: 1.0}
    tuned = precise(model, Components(heads, (1,)))
    data = tokenize(model.tokenizer, examples[:6], 1024)
    inputs = collate(data, model.tokenizer.pad_token_id, "cpu")
    labels = inputs.pop("labels")
    loss = completion_loss_sum(tuned.module(**inputs, use_cache=False).logits, labels) / n_loss_tokens(data)
    loss.backward()
    trainable = tuned.named_trainable()
    before = {n: p.grad.clone() for n, p in trainable}
    assert all(g.abs().max() > 0 for g in before.values())
    tuned.rescale_grads()
    delta_params = {id(p): d.layer for d in tuned.deltas.values() for p in d.parameters()}
    assert {layer for layer in delta_params.values()} == {0, 1, 2}
    for name, p in trainable:
        if id(p) in delta_params:
            assert torch.equal(p.grad, before[name] * expected[delta_params[id(p)]]), name
        else:  # the MLP is not a head: untouched
            assert ".mlp." in name and torch.equal(p.grad, before[name]), name


def test_adamw_is_invariant_to_the_rescale(examples, tmp_path):
    # eps breaks the invariance by about eps / |grad| per coordinate, compounded over the steps: with
    # 1e-12 the runs already differ by ~1e-6 here; 1e-16 leaves only rounding (and eps = 0 gives
    # bit-equal results, the scales 2 and 4 being powers of two).
    settings = dict(adam_eps=1e-16)
    on = _run(examples, tmp_path, "on", rescale=True, **settings)
    off = _run(examples, tmp_path, "off", rescale=False, **settings)
    worst, smallest = _rel_diff(on, off)
    assert smallest > 1e-3, "training did not move the deltas"
    assert worst < 1e-6, worst


def test_sgd_sees_the_rescale(examples, tmp_path):
    # One step from zero deltas: delta = -lr * scale * grad, so the two runs differ by exactly the scale.
    on = _run(examples, tmp_path, "on1", rescale=True, optimizer="sgd", max_steps=1)
    off = _run(examples, tmp_path, "off1", rescale=False, optimizer="sgd", max_steps=1)
    per_layer = {1: 2.0, 2: 4.0}
    for key in on:
        scale = per_layer[int(key.split(".")[0])]
        for x, y in zip(on[key], off[key]):
            assert y.abs().max() > 0
            torch.testing.assert_close(x, scale * y, rtol=1e-12, atol=0)
    # Several steps: the runs go apart (no fixed ratio any more, but far from equal).
    on = _run(examples, tmp_path, "on4", rescale=True, optimizer="sgd")
    off = _run(examples, tmp_path, "off4", rescale=False, optimizer="sgd")
    worst, _ = _rel_diff(on, off)
    assert worst > 0.1, worst


def test_clipped_adamw_sees_the_rescale(examples, tmp_path):
    settings = dict(adam_eps=1e-16, max_grad_norm=1e-3)
    on = _run(examples, tmp_path, "on", rescale=True, **settings)
    off = _run(examples, tmp_path, "off", rescale=False, **settings)
    unclipped = _run(examples, tmp_path, "unclipped", rescale=False, adam_eps=1e-16)
    clipping, _ = _rel_diff(off, unclipped)
    assert clipping > 1e-3, f"max_grad_norm did not clip (relative change {clipping})"
    worst, _ = _rel_diff(on, off)
    # ~2e-3 here; a rescale by one common factor (which clipping cannot see) gives ~1e-7.
    assert worst > 1e-4, worst
