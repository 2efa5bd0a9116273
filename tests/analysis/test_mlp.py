"""MLP probes against a direct numpy computation, and the turning-point rule."""
import numpy as np
import pytest
import torch

from keyheads.analysis.common import Sample
from keyheads.analysis.mlp import (
    answer_specific,
    case_numbers,
    curves_of,
    end_vectors,
    mlp_read_point,
    number_vocab,
    probe,
    turning_points,
)
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



# answers 7, 7, 2, 9, 7, 2, 5: a repeated answer weighs in the null once per prompt that has it
SPECIFIC = [("3 + 4 = ", "7"), ("1 + 2 = 3\n5 + 2 = ", "7"), ("6 - 4 = ", "2"), ("1 + 2 = 3\n4 + 5 = ", "9"),
            ("1 + 2 = 3\n4 + 4 = 8\n9 - 2 = ", "7"), ("8 - 6 = ", "2"), ("1 + 4 = ", "5")]


def direct_answer_specific(model, prompts: list[str], answers: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(d, own) [prompt][layer] by the definition, one prompt at a time in float64: own = cos(write, W_U[C_i]),
    d = own - its mean over the prompts with another answer. The write is the MLP module's own output at the
    last position (what these families add to the residual stream), read by plain forward hooks."""
    W = model.hf.get_output_embeddings().weight.detach().double().numpy()
    mlps = [m for name, m in model.hf.named_modules() if name.endswith(".mlp")]
    assert len(mlps) == model.n_layers
    got: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, l=l: got.__setitem__(l, out[0, -1]))
             for l, m in enumerate(mlps)]
    writes = []
    try:
        for p in prompts:
            with torch.no_grad():
                model.hf(input_ids=model.tokenizer(p, return_tensors="pt")["input_ids"])
            writes.append([got[l].double().numpy() for l in range(model.n_layers)])
    finally:
        for h in hooks:
            h.remove()
    cos = lambda x, y: float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))  # noqa: E731
    d, own = [], []
    for i in range(len(prompts)):
        others = [j for j in range(len(prompts)) if answers[j] != answers[i]]
        own.append([cos(writes[i][l], W[answers[i]]) for l in range(model.n_layers)])
        d.append([own[i][l] - sum(cos(writes[i][l], W[answers[j]]) for j in others) / len(others)
                  for l in range(model.n_layers)])
    return np.array(d), np.array(own)


def specific_samples(model) -> list[Sample]:
    """SPECIFIC's prompts with their operands (the last line's A and B) and answer tokens."""
    return [Sample(p, c, model.tokens(c)[0], operands=dict(zip("AB", p.splitlines()[-1].split()[::2])))
            for p, c in SPECIFIC]


def test_answer_specific_equals_the_definition(model):
    samples = specific_samples(model)
    prompts, answers = [s.prompt for s in samples], [s.answer_id for s in samples]
    mlp_in, write = end_vectors(model, prompts, batch_size=3, progress=False)  # batches with padding and a cache
    got = answer_specific(model, write, answers)
    want, own = direct_answer_specific(model, prompts, answers)
    assert got.shape == (len(SPECIFIC), model.n_layers) and np.abs(want).max() > 1e-3
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    # the write and the answer are write_C's
    np.testing.assert_allclose(curves_of(model, samples, mlp_in, write)["write_C"], own, atol=1e-6, rtol=0)


def test_answer_specific_is_empty_when_every_prompt_has_one_answer(model):
    """No prompt has another answer to contrast with: every prompt is dropped (never a 0/0)."""
    samples = [s for s in specific_samples(model) if s.answer == "7"]
    _, write = end_vectors(model, [s.prompt for s in samples], progress=False)
    assert answer_specific(model, write, [s.answer_id for s in samples]).shape == (0, model.n_layers)
