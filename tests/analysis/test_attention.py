"""END-row attention by role against the full patterns from output_attentions."""
import numpy as np
import pytest
import torch

from keyheads.analysis.attention import ROLES, by_role, end_attention, label_heads, role_ids
from keyheads.analysis.common import AnalysisError, Sample
from keyheads.testing import tiny_model


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    return tiny_model(request.param)


def samples_of_different_lengths():
    out = []
    for prefix in ("", "9 * 9 = 81\n", "1 + 2 = 3\n4 + 4 = 8\n"):  # different lengths: left padding differs
        for a, op, b in (("3", "+", "4"), ("7", "-", "2")):
            p = f"{prefix}{a} {op} {b} = "
            n = len(prefix)
            out.append(Sample(p, "7", 0, positions={"A": n, "B": n + 4, "operator": n + 2}))
    return out


def test_end_row_by_role_equals_sums_of_the_full_pattern(model):
    samples = samples_of_different_lengths()
    heads = [(0, 1), (2, 3), (2, 0), (1, 2)]
    rows = end_attention(model, [s.prompt for s in samples], heads, batch_size=4, progress=False)
    got = by_role(rows, samples)
    for i, s in enumerate(samples):  # direct: one prompt at a time, no padding, HF's own attention weights
        with model.eager_attention(), torch.no_grad():
            att = model.hf(**model.encode([s.prompt]).as_kwargs(), output_attentions=True).attentions
        n = len(model.tokens(s.prompt, add_special_tokens=True))
        for j, (l, h) in enumerate(heads):
            end = att[l][0, h, -1].float().numpy()
            assert end.shape == (n,)
            np.testing.assert_allclose(rows[i][j], end, atol=1e-5)
            p = s.positions
            first = 0.0 if 0 in p.values() else end[0]  # an operand at position 0 counts as the operand
            want = [end[p["A"]], end[p["B"]], end[p["operator"]],
                    end.sum() - end[p["A"]] - end[p["B"]] - end[p["operator"]] - first, first]
            np.testing.assert_allclose(got[i, j], want, atol=1e-5)
            assert abs(got[i, j].sum() - 1) < 1e-5


def test_operands_win_over_first_token_and_missing_positions_are_explained():
    ids = role_ids({"A": 0, "B": 4, "operator": 2}, 8)
    assert ids[0] == ROLES.index("A") and ids[4] == ROLES.index("B") and ids[2] == ROLES.index("operator")
    assert (ids == ROLES.index("first")).sum() == 0
    with pytest.raises(AnalysisError, match="positions"):
        role_ids(None, 8)


def test_labels_follow_where_attention_goes():
    m = np.array([[0.3, 0.3, 0.1, 0.1, 0.2],    # operands
                  [0.05, 0.05, 0.4, 0.1, 0.4],  # operator (the first token is left out)
                  [0.0, 0.1, 0.1, 0.3, 0.5]])   # other words
    labels = label_heads([(0, 0), (1, 1), (2, 2)], m)
    assert [l.label for l in labels] == ["operand", "operator", "text"]
    assert [l.lean for l in labels] == ["operand", "operator", "operand"]
    assert labels[0].operand_A_plus_B == pytest.approx(0.6)


def test_top_other_tokens_marks_the_end_token(llama):
    from keyheads.analysis.attention import top_other_tokens

    s = Sample("x 3 + 4 = ", "7", 0, positions={"A": 2, "B": 6, "operator": 4})
    row = np.zeros((1, 10))
    row[0, 8], row[0, 9], row[0, 0], row[0, 2] = 0.5, 0.3, 0.1, 0.1
    top = top_other_tokens(llama, [row, row], [s, s], k=2)
    assert top == [[("=", pytest.approx(0.5)), ("␣ (END)", pytest.approx(0.3))]]
