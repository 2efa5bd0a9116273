"""The per-head slices of the family files, checked by what they do rather than by their indices.

Perturbing the W_Q block `qkv_rows(config, "q", h)` must change head h's output and no other head's;
perturbing the W_K or W_V block of key/value head g must change exactly the query heads that read g;
perturbing the W_O columns `o_cols(config, h)` must act on the attention output as that perturbation
applied to head h's output alone. `head_out` is the input of the output projection, so a wrong slice
(another head's block, a q|k|v mix-up in a fused projection, an interleaving error) shows up as a
change in the wrong head.
"""
import pytest
import torch

from keyheads.testing import TINY_FAMILIES, tiny_model

LAYER = 1
PROMPTS = ["12 + 34 = ", "7 plus 8 is"]
ATOL = 1e-6


def _model(family):
    return tiny_model(family, seed=3, dtype=torch.float64)


def _head_out(model, batch, layer=LAYER):
    _, cache = model.run(batch, capture=[f"{layer}.head_out"])
    return cache[f"{layer}.head_out"]


def _real(batch):
    """Positions that are not left padding, [batch, pos] bool."""
    return batch.attention_mask.bool()


@torch.no_grad()
def _perturb_features(model, layer, path, index, seed):
    """Add noise in place to output features `index` of a projection: rows of a Linear weight,
    columns of a Conv1D weight, and those bias entries."""
    module = model.layer_module(layer, path)
    g = torch.Generator().manual_seed(seed)
    idx = torch.tensor(list(index))
    w = module.weight
    if model.family.conv1d:  # Conv1D: [in, out]
        w[:, idx] += 0.5 * torch.randn(w.shape[0], len(idx), generator=g, dtype=w.dtype)
    else:
        w[idx] += 0.5 * torch.randn(len(idx), w.shape[1], generator=g, dtype=w.dtype)
    if getattr(module, "bias", None) is not None:
        module.bias[idx] += 0.5 * torch.randn(len(idx), generator=g, dtype=w.dtype)


def _changed_heads(before, after, real):
    """Heads whose output changed anywhere at a non-padding position; also the per-head max change."""
    diff = (after - before).abs()[real]  # [n_real, head, head_dim]
    per_head = diff.amax(dim=(0, 2))
    return {h for h, d in enumerate(per_head.tolist()) if d > ATOL}, per_head


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_slices_partition_the_projections(family):
    """Sanity of the index arithmetic: Q/K/V blocks of all heads tile each projection's outputs
    exactly once, W_O blocks tile its inputs, and every block is head_dim wide."""
    model = _model(family)
    fam, config = model.family, model.config
    hd = model.head_dim
    per_module: dict[str, list[int]] = {}
    for kind, n in (("q", model.n_heads), ("k", model.n_kv_heads), ("v", model.n_kv_heads)):
        for head in range(n):
            path, index = fam.qkv_rows(config, kind, head)
            assert len(index) == hd
            per_module.setdefault(path, []).extend(index)
    from keyheads.finetune.layer import in_out

    for path, features in per_module.items():
        _, d_out = in_out(model.layer_module(LAYER, path))
        assert sorted(features) == list(range(d_out)), path
    cols = []
    for head in range(model.n_heads):
        path, index = fam.o_cols(config, head)
        assert path == fam.attn_out_proj and len(index) == hd
        cols.extend(index)
    d_in, _ = in_out(model.layer_module(LAYER, fam.attn_out_proj))
    assert sorted(cols) == list(range(d_in))


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_q_block_changes_only_its_head(family):
    base = _model(family)
    batch = base.encode(PROMPTS)
    real = _real(batch)
    before = _head_out(base, batch)
    for head in range(base.n_heads):
        model = _model(family)
        path, index = model.family.qkv_rows(model.config, "q", head)
        _perturb_features(model, LAYER, path, index, seed=head)
        after = _head_out(model, batch)
        changed, per_head = _changed_heads(before, after, real)
        assert changed == {head}, f"W_Q block of head {head} changed heads {sorted(changed)}: {per_head.tolist()}"
        # The layers below read nothing of it.
        assert torch.equal(_head_out(model, batch, LAYER - 1), _head_out(base, batch, LAYER - 1))


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("kind", ["k", "v"])
def test_kv_block_changes_exactly_its_group(family, kind):
    base = _model(family)
    batch = base.encode(PROMPTS)
    real = _real(batch)
    before = _head_out(base, batch)
    fam, config = base.family, base.config
    for group in range(base.n_kv_heads):
        model = _model(family)
        path, index = fam.qkv_rows(config, kind, group)
        _perturb_features(model, LAYER, path, index, seed=100 + group)
        after = _head_out(model, batch)
        changed, per_head = _changed_heads(before, after, real)
        readers = {h for h in range(base.n_heads) if fam.kv_head_of(config, h) == group}
        assert readers, f"no query head reads kv head {group}"
        assert changed == readers, (f"W_{kind.upper()} block of kv head {group} changed heads {sorted(changed)}, "
                                    f"expected {sorted(readers)}: {per_head.tolist()}")


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_o_cols_act_on_their_head_only(family):
    base = _model(family)
    batch = base.encode(PROMPTS)
    real = _real(batch)
    key_h, key_o = f"{LAYER}.head_out", f"{LAYER}.attn_out"
    _, cache = base.run(batch, capture=[key_h, key_o])
    head_out, attn_out = cache[key_h], cache[key_o]
    for head in range(base.n_heads):
        path, index = base.family.o_cols(base.config, head)
        idx = torch.tensor(list(index))

        # Zeroing head h's W_O columns == zeroing head h's output before the projection.
        zeroed = _model(family)
        with torch.no_grad():
            w = zeroed.layer_module(LAYER, path).weight
            if zeroed.family.conv1d:  # Conv1D [in, out]: input features are rows
                w[idx] = 0
            else:
                w[:, idx] = 0
        _, got = zeroed.run(batch, capture=[key_o])

        def knock(x, head=head):
            x = x.clone()
            x[..., head, :] = 0
            return x

        _, want = base.run(batch, capture=[key_o], edit={key_h: knock})
        assert (got[key_o] - want[key_o])[real].abs().max().item() < ATOL
        assert (got[key_o] - attn_out)[real].abs().max().item() > 1e-3, "zeroing the columns changed nothing"

        # A random perturbation P of those columns adds head_out[..., h, :] @ P^T, nothing else.
        perturbed = _model(family)
        g = torch.Generator().manual_seed(200 + head)
        P = torch.randn(base.d_model, len(idx), generator=g, dtype=torch.float64)  # [d_out, head_dim]
        with torch.no_grad():
            w = perturbed.layer_module(LAYER, path).weight
            if perturbed.family.conv1d:
                w[idx] += P.T
            else:
                w[:, idx] += P
        _, got = perturbed.run(batch, capture=[key_h, key_o])
        assert torch.equal(got[key_h], head_out)  # the heads' outputs themselves are untouched
        expected = attn_out + head_out[..., head, :] @ P.T
        assert (got[key_o] - expected)[real].abs().max().item() < ATOL
