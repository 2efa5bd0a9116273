"""MLP probes against a direct numpy computation, and the turning-point rule."""
import numpy as np
import pytest

from keyheads.analysis.common import Sample
from keyheads.analysis.mlp import case_numbers, mlp_read_point, number_vocab, probe, turning_points
from keyheads.testing import tiny_model


@pytest.fixture(scope="module", params=["llama", "gpt_neox"])  # gpt_neox: parallel residual, MLP reads resid_pre
def model(request):
    return tiny_model(request.param)


def test_cosines_equal_numpy(model):
    prompts = [("3 + 4 = ", "3", "4", "7"), ("1 + 2 = 3\n5 + 2 = ", "5", "2", "7"), ("6 - 4 = ", "6", "4", "2"),
               # two of one length behind a shared prefix: their prefix runs once, from a cache
               ("1 + 2 = 3\n4 + 4 = 8\n5 + 2 = ", "5", "2", "7"), ("1 + 2 = 3\n4 + 4 = 8\n6 - 4 = ", "6", "4", "2")]
    tok = lambda t: model.tokens(t)[0]  # noqa: E731  (character tokenizer: a digit is one token)
    samples = [Sample(p, c, tok(c), operands={"A": a, "B": b}) for p, a, b, c in prompts]
    got = probe(model, samples, batch_size=2, progress=False)
    W = model.W_U.detach().numpy()
    digits = [tok(str(d)) for d in range(10)]
    read = mlp_read_point(model)
    assert read == ("resid_pre" if model.parallel_residual else "resid_mid")
    cos = lambda x, y: x @ y / np.linalg.norm(x) / np.linalg.norm(y)  # noqa: E731
    for i, (p, a, b, c) in enumerate(prompts):
        _, cache = model.run(model.encode([p]), capture=[f"{l}.{pt}" for l in range(model.n_layers)
                                                        for pt in (read, "mlp_write")])
        for l in range(model.n_layers):
            x = cache[f"{l}.{read}"][0, -1].numpy()
            w = cache[f"{l}.mlp_write"][0, -1].numpy()
            assert got["in_A"][i, l] == pytest.approx(cos(x, W[tok(a)]), abs=1e-5)
            assert got["in_B"][i, l] == pytest.approx(cos(x, W[tok(b)]), abs=1e-5)
            assert got["write_C"][i, l] == pytest.approx(cos(w, W[tok(c)]), abs=1e-5)
            others = [cos(w, W[d]) for d in digits if d != tok(c)]
            assert got["write_other"][i, l] == pytest.approx(np.mean(others), abs=1e-5)
            others = [cos(x, W[d]) for d in digits if d not in (tok(a), tok(b))]
            assert got["in_other"][i, l] == pytest.approx(np.mean(others), abs=1e-5)


def test_case_numbers_are_the_digits(model):
    assert list(number_vocab(model)) == [str(d) for d in range(10)]
    names, cos = case_numbers(model, "4 + 3 = ")
    assert cos.shape == (model.n_layers, 10)


def test_turning_points_rule():
    s = [0.0, 0.02, 0.01, 0.05, 0.5, 0.9, 1.0, 0.7, 0.4, 0.2, 0.1, 0.1]
    c = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.01, 0.05, 0.2, 0.3, 0.25, 0.2]
    tp = turning_points(s, c)
    assert (tp.start, tp.inflection, tp.end) == (4, 6, 9)
    assert tp.text() == "4-6-9"
    # a high first layer is not a climb: the inflection ends the largest rise from an earlier low
    tp = turning_points([0.5, -0.1, -0.1, 0.0, 0.3, 0.2], [0, 0, 0, 0, 0.1, 0.2])
    assert (tp.start, tp.inflection, tp.end) == (3, 4, 5)
    # the answer peak is searched only from the inflection on
    assert turning_points(s, [1.0] + c[1:]).end == 9
