"""Precise SFT computes no full-matrix weight gradient and no backward below the lowest trained layer,
shown by counting the matmul FLOPs of one training micro-step and comparing them with a count made
by hand from the module shapes.

Only the top layer's heads are trained, so the backward pass may touch only: the input gradients of
the modules above the point where the graph starts (the top layer's W_O, its MLP, the unembedding),
the attention core of the top layer (Q, K and V all depend on deltas), and the deltas' own weight
gradients (plus the input gradient of the W_O column delta, whose input is the attention output).
FlopCounterMode counts mm/bmm (not norms, softmax, elementwise ops or the loss), so with eager
attention the hand count is exact.
"""
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from keyheads.components import Components
from keyheads.finetune.data import collate, tokenize
from keyheads.finetune.layer import ColDelta, RowDelta
from keyheads.finetune.model import full, precise
from keyheads.finetune.train import completion_loss_sum
from keyheads.testing import tiny_model

TOP = 2
HEADS = ((TOP, 0), (TOP, 1))  # one K/V group of the tiny Llama (4 query heads, 2 K/V heads)
RTOL = 0.005


def _model():
    model = tiny_model("llama", seed=0)
    model.hf.set_attn_implementation("eager")  # attention matmuls as bmm, so they are counted
    return model


def _batch(model, examples):
    data = tokenize(model.tokenizer, examples[:8], 1024)
    inputs = collate(data, model.tokenizer.pad_token_id, "cpu")
    labels = inputs.pop("labels")
    return inputs, labels


def _measure(module, inputs, labels):
    """(total, mm, bmm) FLOPs of one forward + completion loss + backward."""
    module.train()
    with FlopCounterMode(display=False) as counter:
        logits = module(**inputs, use_cache=False).logits
        completion_loss_sum(logits, labels).backward()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    return counter.get_total_flops(), by_op.get("aten.mm", 0), by_op.get("aten.bmm", 0)


def _linears(model):
    """(layer or None, layer-relative name, in, out) of every nn.Linear of the base model."""
    prefix = model.family.layers + "."
    out = []
    for name, m in model.hf.named_modules():
        if isinstance(m, nn.Linear):
            layer, rel = None, name
            if name.startswith(prefix):
                layer_s, _, rel = name[len(prefix):].partition(".")
                layer = int(layer_s)
            out.append((layer, rel, m.in_features, m.out_features))
    return out


def _attention_fwd(model, B, S):
    """QK^T and AV of one layer: 2 matmuls of 2*B*H*S*S*hd each."""
    return 2 * (2 * B * model.n_heads * S * S * model.head_dim)


def test_precise_backward_stops_at_the_trained_layer(examples):
    model = _model()
    inputs, labels = _batch(model, examples)
    B, S = inputs["input_ids"].shape
    T = B * S  # padding included: the matmuls run over it
    linears = _linears(model)
    attn = _attention_fwd(model, B, S)
    fam = model.family
    qkv_paths = {fam.q_proj, fam.k_proj, fam.v_proj}

    # Full SFT on the same batch: every Linear has an input and a weight gradient (the embedding
    # requires grad, so even layer 0's input does): 3x the forward, attention included.
    fwd_linear = sum(2 * T * i * o for _, _, i, o in linears)
    fwd_attn = model.n_layers * attn
    full_measured, _, _ = _measure(full(model).module, inputs, labels)
    full_analytic = 3 * (fwd_linear + fwd_attn)
    assert abs(full_measured - full_analytic) <= RTOL * full_analytic, (full_measured, full_analytic)
    model.hf.zero_grad(set_to_none=True)

    tuned = precise(model, Components(HEADS, ()))
    assert {d.layer for d in tuned.deltas.values()} == {TOP}
    measured, mm, bmm = _measure(tuned.module, inputs, labels)

    # Forward: every base Linear, the deltas' matmuls, the attention of every layer.
    fwd_delta = sum(2 * T * d.weight.numel() for d in tuned.deltas.values())
    # Backward: input gradients of the base Linears at or above TOP whose input requires grad. In
    # layer TOP the Q/K/V projections read the (gradient-free) residual from below: nothing there.
    bwd_input = sum(2 * T * i * o for layer, rel, i, o in linears
                    if layer is None or (layer >= TOP and not (layer == TOP and rel in qkv_paths)))
    # Each delta's weight gradient; the W_O column delta also passes a gradient to its input (the
    # attention output, which depends on the Q/K/V deltas); the row deltas' input has none.
    bwd_delta = sum(2 * T * d.weight.numel() * (2 if isinstance(d, ColDelta) else 1) for d in tuned.deltas.values())
    assert all(isinstance(d, (RowDelta, ColDelta)) for d in tuned.deltas.values())
    bwd_attn = 2 * attn  # layer TOP only: gradients of Q, K, the pattern and V
    mm_analytic = fwd_linear + fwd_delta + bwd_input + bwd_delta
    bmm_analytic = fwd_attn + bwd_attn
    analytic = mm_analytic + bmm_analytic

    # The smallest thing that would break the claim: one more full-matrix weight gradient (the
    # smallest frozen Linear of layer TOP) or backward into layer TOP's Q/K/V inputs. The tolerance
    # must be below it, or the test would not see it.
    smallest_leak = min(2 * T * i * o for layer, _, i, o in linears if layer == TOP)
    assert RTOL * analytic < smallest_leak

    print(f"precise: measured {measured} (mm {mm}, bmm {bmm}), analytic {analytic} "
          f"(mm {mm_analytic}, bmm {bmm_analytic}); full SFT: measured {full_measured}, analytic {full_analytic}")
    assert abs(mm - mm_analytic) <= RTOL * mm_analytic, (mm, mm_analytic)
    assert abs(bmm - bmm_analytic) <= RTOL * bmm_analytic, (bmm, bmm_analytic)
    assert abs(measured - analytic) <= RTOL * analytic, (measured, analytic)
    # Discriminating: full SFT on the same batch costs far more.
    assert full_measured > 1.5 * measured, (full_measured, measured)
    # And the backward really ran: every delta got a gradient.
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for d in tuned.deltas.values() for p in d.parameters())
