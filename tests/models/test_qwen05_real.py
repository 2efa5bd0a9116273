"""The optional bundled Qwen2.5-Coder-0.5B-Instruct: its shape, exact head slices, and arithmetic.

Skipped unless its 6 packages are installed. The first run joins and converts the model into
$KEYHEADS_CACHE (under a minute); later runs load the fp32 cache.
"""
import os
import subprocess
import sys

import pytest
import torch

from keyheads.models import load_model
from keyheads.models.bundled import BUNDLED

pytestmark = pytest.mark.real_model
QWEN = BUNDLED["qwen2.5-coder-0.5b"]
SHOTS = {"+": "12 + 35 = 47\n61 + 28 = 89\n44 + 39 = 83\n", "*": "12 * 3 = 36\n7 * 14 = 98\n21 * 4 = 84\n"}


def _need_qwen():
    if not QWEN.installed():
        pytest.skip(f"optional: {QWEN.pip}")


# First in the file, before the fixture below holds a second copy of the model in this process.
@pytest.mark.parametrize("prompt, want", [("1 + 2 = 3\\n5 + 3 = ", "8"), ("1 + 2 = 3\\n15 + 27 = ", "42")])
def test_cli_generate_adds(prompt, want):
    _need_qwen()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-m", "keyheads.cli", "generate", "--model", QWEN.name, "--escapes", "--max-new-tokens", "3",
         prompt],
        capture_output=True, text=True, env=env, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0].strip() == want


@pytest.fixture(scope="module")
def qwen():
    _need_qwen()
    return load_model(QWEN.name, device="cpu")


def test_shape(qwen):
    assert (qwen.n_layers, qwen.n_heads, qwen.n_kv_heads, qwen.head_dim, qwen.d_model) == (24, 14, 2, 64, 896)
    hf = qwen.hf
    assert hf.config.vocab_size == 151_936 and hf.get_input_embeddings().weight.shape == (151_936, 896)
    assert hf.config.tie_word_embeddings and hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    attn = qwen.layer_module(0, "self_attn")
    assert [getattr(attn, p).bias is not None for p in ("q_proj", "k_proj", "v_proj", "o_proj")] == [
        True, True, True, False]
    assert sum(p.numel() for p in hf.parameters()) == 494_032_768  # the tied matrix counted once
    assert [qwen.tokenizer.decode([t]) for t in qwen.tokens("15 + 27")] == ["1", "5", " +", " ", "2", "7"]


def test_head_slices_and_tied_unembedding_are_exact(qwen):
    batch = qwen.encode([SHOTS["+"] + "15 + 27 = "])
    resid = {}
    last = qwen.layers[-1].register_forward_hook(
        lambda m, i, o: resid.setdefault("x", o[0] if isinstance(o, tuple) else o)
    )
    try:
        logits, cache = qwen.run(batch, capture=[f"{n}.{p}" for n in (0, 23) for p in ("head_out", "attn_out")])
    finally:
        last.remove()
    for n in (0, 23):  # o_proj has no bias, so the per-head W_O slices sum to its output
        total = qwen.out_proj_heads(n, cache[f"{n}.head_out"]).sum(-2)
        torch.testing.assert_close(total, cache[f"{n}.attn_out"], atol=1e-4, rtol=1e-5)
    tokens = torch.tensor([qwen.tokens(d)[0] for d in "4297"])
    picked = qwen.unembed(resid["x"][0, -1].expand(len(tokens), -1), tokens)
    torch.testing.assert_close(picked, logits[0, -1, tokens], atol=1e-4, rtol=1e-5)
    assert qwen.tokenizer.decode(logits[0, -1].argmax()) == "4"
