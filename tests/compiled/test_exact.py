"""The GPT-2 folders compiled from RASP programs compute what tracr's own model computes: the output space's
logits at every position, on every input of every length up to the program's maximum, within 1e-5. tracr's
outputs were recorded with jax by studies/compile_circuits.py; these tests need only keyheads."""
import pytest
import torch

from keyheads.models.model import get_path

from .circuits import PROGRAMS, circuit

TOLERANCE = 1e-5


def test_the_fixtures_hold_the_programs_the_issue_asks_for():
    truths = [circuit(name).truth for name in PROGRAMS]
    assert len(truths) >= 4
    assert any(len({h["head"] for h in t["heads"] if h["layer"] == 0}) > 1 for t in truths)  # several heads a layer
    assert any(not h["on_path"] for t in truths for h in t["heads"])  # a compiled head off the output's path
    assert any(h["on_path"] and not h["direct"] for t in truths for h in t["heads"])  # one acting through a head


@pytest.mark.parametrize("name", PROGRAMS)
def test_logits_equal_tracr_on_every_input(name):
    c = circuit(name)
    model = c.model()
    tok = model.tokenizer
    out_ids = [tok.convert_tokens_to_ids(w) for w in c.truth["conversion"]["output_values"]]
    assert tok.unk_token_id not in out_ids
    others = [i for i in range(model.config.vocab_size) if i not in out_ids]
    by_length: dict[int, list[dict]] = {}
    for row in c.outputs:
        by_length.setdefault(len(row["logits"]), []).append(row)
    n = 0
    for rows in by_length.values():
        with torch.no_grad():
            logits = model.forward(model.encode([r["prompt"] for r in rows]))  # [n, T, vocab]
        expected = torch.tensor([r["logits"] for r in rows])  # [n, T, n_out]
        assert logits.shape[:2] == expected.shape[:2]
        torch.testing.assert_close(logits[..., out_ids], expected, atol=TOLERANCE, rtol=0)
        # every other token reads minus the constant coordinate: exactly -1, below every output logit
        torch.testing.assert_close(logits[..., others], torch.full_like(logits[..., others], -1.0),
                                   atol=TOLERANCE, rtol=0)
        n += len(rows)
    assert n == sum(len(c.truth["vocab"]) ** k for k in range(1, c.truth["max_seq_len"] + 1))


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_answer_at_end_is_the_programs(name):
    c = circuit(name)
    model = c.model()
    with torch.no_grad():
        logits = model.forward(model.encode([r["prompt"] for r in c.domain]))[:, -1]
    predicted = [model.tokenizer.decode([int(i)]).strip() for i in logits.argmax(-1)]
    assert predicted == [r["answer"] for r in c.domain]


@pytest.mark.parametrize("name", PROGRAMS)
def test_compiled_heads_have_weights_and_the_others_none(name):
    """The ground truth's heads are in the weights (the off-path one too); every other head is all zeros."""
    c = circuit(name)
    model = c.model()
    fam = model.family
    for layer in range(model.n_layers):
        block = model.layers[layer]
        qkv = get_path(block, fam.qkv_proj).weight  # Conv1D: [in, out]
        o_path, _ = fam.o_cols(model.config, 0)
        o = get_path(block, o_path).weight
        for head in range(model.n_heads):
            parts = [qkv[:, fam.qkv_rows(model.config, kind, head)[1]] for kind in "qkv"]
            parts.append(o[fam.o_cols(model.config, head)[1]])
            nonzero = [bool(p.abs().sum() > 0) for p in parts]
            compiled = (layer, head) in c.compiled
            assert nonzero == ([True] * 4 if compiled else [False] * 4), (layer, head, nonzero)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_compiled_circuit_is_refused_in_a_dtype_it_is_not_exact_in(dtype):
    """Its norm weights (2^25) and layer-norm epsilon (2^50) overflow float16 and lose bits in bfloat16."""
    from keyheads.errors import SettingError
    from keyheads.models import load_model

    folder = circuit("add").folder
    with pytest.raises(SettingError, match="exact only in float32.*--dtype float32"):
        load_model(str(folder), device="cpu", dtype=dtype)
    assert load_model(str(folder), device="cpu").dtype == torch.float32  # the default, on any device
