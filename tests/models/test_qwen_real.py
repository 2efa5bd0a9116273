"""The optional bundled Qwen2.5-Coder models (0.5B and 1.5B Instruct): shape, exact head slices, and arithmetic.

Each size is skipped unless its packages are installed (6 for 0.5B, 22 for 1.5B). The first run joins and converts
the model into $KEYHEADS_CACHE (1.5B: minutes and about 9 GB of memory); later runs load the fp32 cache. One size's
tests run before the other's fixture loads, so at most one copy of a model is held at a time.
"""
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from keyheads.models import load_model
from keyheads.models.bundled import BUNDLED

pytestmark = pytest.mark.real_model
SHOTS = {"+": "12 + 35 = 47\n61 + 28 = 89\n44 + 39 = 83\n", "*": "12 * 3 = 36\n7 * 14 = 98\n21 * 4 = 84\n"}


@dataclass(frozen=True)
class Size:
    """What one size's config and weights say: (layers, heads, kv heads, head dim, width) and parameters."""
    name: str
    shape: tuple[int, int, int, int, int]
    params: int  # the tied embedding counted once
    greedy: tuple[tuple[int, str, int], ...]  # sums and products it answers greedily, 3-shot


SIZES = [
    Size("qwen2.5-coder-0.5b", (24, 14, 2, 64, 896), 494_032_768, ()),
    Size("qwen2.5-coder-1.5b", (28, 12, 2, 128, 1536), 1_543_714_304,
         ((47, "+", 20), (49, "+", 64), (58, "+", 77), (38, "+", 89), (12, "*", 75), (36, "*", 14))),
]
IDS = [s.name for s in SIZES]


def _need(size: Size):
    if not BUNDLED[size.name].installed():
        pytest.skip(f"optional: {BUNDLED[size.name].pip}")


@pytest.fixture(scope="module", params=SIZES, ids=IDS)
def qwen(request):
    _need(request.param)
    return request.param, load_model(request.param.name, device="cpu")


@pytest.mark.parametrize("size", SIZES, ids=IDS)
@pytest.mark.parametrize("prompt, want", [("1 + 2 = 3\\n5 + 3 = ", "8"), ("1 + 2 = 3\\n15 + 27 = ", "42")])
def test_cli_generate_adds(size, prompt, want):
    _need(size)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "keyheads.cli", "generate", "--model", size.name, "--escapes",
                          "--max-new-tokens", "3", prompt], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0].strip() == want


def test_shape(qwen):
    size, model = qwen
    assert (model.n_layers, model.n_heads, model.n_kv_heads, model.head_dim, model.d_model) == size.shape
    hf = model.hf
    assert hf.config.vocab_size == 151_936 and hf.get_input_embeddings().weight.shape == (151_936, size.shape[-1])
    assert hf.config.tie_word_embeddings and hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    attn = model.layer_module(0, "self_attn")
    assert [getattr(attn, p).bias is not None for p in ("q_proj", "k_proj", "v_proj", "o_proj")] == [
        True, True, True, False]
    assert sum(p.numel() for p in hf.parameters()) == size.params
    assert [model.tokenizer.decode([t]) for t in model.tokens("15 + 27")] == ["1", "5", " +", " ", "2", "7"]


def test_head_slices_and_tied_unembedding_are_exact(qwen):
    _, model = qwen
    last_layer = model.n_layers - 1
    batch = model.encode([SHOTS["+"] + "15 + 27 = "])
    resid = {}
    hook = model.layers[-1].register_forward_hook(
        lambda m, i, o: resid.setdefault("x", o[0] if isinstance(o, tuple) else o))
    try:
        logits, cache = model.run(batch, capture=[f"{n}.{p}" for n in (0, last_layer)
                                                  for p in ("head_out", "attn_out")])
    finally:
        hook.remove()
    for n in (0, last_layer):  # o_proj has no bias, so the per-head W_O slices sum to its output
        total = model.out_proj_heads(n, cache[f"{n}.head_out"]).sum(-2)
        torch.testing.assert_close(total, cache[f"{n}.attn_out"], atol=1e-4, rtol=1e-5)
    tokens = torch.tensor([model.tokens(d)[0] for d in "4297"])
    picked = model.unembed(resid["x"][0, -1].expand(len(tokens), -1), tokens)
    torch.testing.assert_close(picked, logits[0, -1, tokens], atol=1e-4, rtol=1e-5)
    assert model.tokenizer.decode(logits[0, -1].argmax()) == "4"


def test_greedy_arithmetic(qwen):
    size, model = qwen
    if not size.greedy:
        pytest.skip(f"{size.name}: no greedy sums listed (its arithmetic is measured in its study)")
    for a, op, b in size.greedy:
        want = a + b if op == "+" else a * b
        got = model.generate(SHOTS[op] + f"{a} {op} {b} = ", max_new_tokens=6).split("\n")[0].strip()
        assert got == str(want), (a, op, b)
