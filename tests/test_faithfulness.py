"""`keyheads faithfulness`: MIB's node-level faithfulness of a circuit, checked against a direct computation.

The direct computation runs one pair at a time, unpadded, with its own PyTorch hooks on the Hugging Face modules
(the input of each layer's o_proj, cut into heads, and the MLP's output), and takes the areas with numpy's
trapezoid rule."""
import math

import numpy as np
import pytest
import torch

from keyheads.circuits import head_node, mlp_node
from keyheads.data.pairs import read_pairs
from keyheads.faithfulness import PERCENTAGES, areas, ranked, sizes
from keyheads.faithfulness.run import components, faithfulness, measure
from keyheads.testing import tiny_model

from tests.helpers import make_rows, write_rows


def test_sizes_and_areas_are_mibs():
    assert sizes(300) == [0, 0, 1, 3, 6, 15, 30, 60, 150, 300]
    f = [0.0, 0.1, 0.2, 0.3, 0.5, 0.6, 0.8, 0.9, 1.0, 1.0]
    cpr, cmd = areas(f)
    assert cpr == pytest.approx(np.trapezoid(f, PERCENTAGES))
    assert cmd == pytest.approx(np.trapezoid([abs(1 - v) for v in f], PERCENTAGES))
    assert areas([1.0] * 10) == pytest.approx((PERCENTAGES[-1] - PERCENTAGES[0], 0.0))
    with pytest.raises(ValueError):
        areas([1.0] * 9)


def test_ranked_highest_first_by_absolute_or_signed_score():
    scores = {"a0.h0": -0.9, "a0.h1": 0.5, "m0": math.nan, "a1.h0": 0.1}
    assert ranked(scores) == ["a0.h0", "a0.h1", "a1.h0"]
    assert ranked(scores, absolute=False) == ["a0.h1", "a1.h0", "a0.h0"]


def _direct_metric(model, pairs, kept: set[str] | None, ablation: str, end_only: bool = False) -> float:
    """The mean answer logit with every component outside `kept` ablated (at every position, or at the last one
    only), one pair at a time."""
    hf, tok = model.hf, model.tokenizer
    layers = hf.model.layers
    n_heads = model.n_heads
    rows = read_pairs(pairs)
    cf_ids = [tok(r.counterfactual, return_tensors="pt").input_ids for r in rows]
    if ablation == "mean-global":  # one mean over every position of every counterfactual prompt
        sums: dict = {}
        count = 0
        for ids in cf_ids:
            seen = _outputs(hf, ids)
            for k, v in seen.items():
                sums[k] = sums.get(k, 0) + v[0].sum(0)
            count += ids.shape[1]
        means = {k: v / count for k, v in sums.items()}
    total = 0.0
    for row, cf in zip(rows, cf_ids):
        ref = tok(row.reference, return_tensors="pt").input_ids
        source = _outputs(hf, cf) if ablation == "counterfactual" else None
        handles = []
        for i, layer in enumerate(layers):
            out_heads = [h for h in range(n_heads) if kept is not None and head_node(i, h) not in kept]
            if out_heads:
                def pre(module, args, i=i, out_heads=out_heads, source=source):
                    x = args[0].clone()
                    d = x.shape[-1] // n_heads
                    at = slice(-1, None) if end_only else slice(None)
                    for h in out_heads:
                        value = source[("head", i)][:, at, h * d:(h + 1) * d] if source is not None \
                            else means[("head", i)][h * d:(h + 1) * d]
                        x[:, at, h * d:(h + 1) * d] = value
                    return (x,)
                handles.append(layer.self_attn.o_proj.register_forward_pre_hook(pre))
            if kept is not None and mlp_node(i) not in kept:
                def post(module, args, output, i=i, source=source):
                    value = source[("mlp", i)] if source is not None else means[("mlp", i)].expand_as(output)
                    out = output.clone()
                    at = slice(-1, None) if end_only else slice(None)
                    out[:, at] = value[:, at]
                    return out
                handles.append(layer.mlp.register_forward_hook(post))
        try:
            with torch.no_grad():
                logits = hf(input_ids=ref).logits[0, -1]
        finally:
            for h in handles:
                h.remove()
        answer = tok(row.reference + row.answer).input_ids[len(ref[0])]
        total += float(logits[answer])
    return total / len(rows)


def _outputs(hf, ids) -> dict:
    """Each layer's o_proj input and MLP output on `ids`."""
    seen, handles = {}, []
    for i, layer in enumerate(hf.model.layers):
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, args, i=i: seen.__setitem__(("head", i), args[0].detach().clone())))
        handles.append(layer.mlp.register_forward_hook(
            lambda m, args, out, i=i: seen.__setitem__(("mlp", i), out.detach().clone())))
    try:
        with torch.no_grad():
            hf(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pairs = write_rows(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", make_rows(12))
    return tiny_model("llama"), pairs


@pytest.mark.parametrize("ablation,positions", [("counterfactual", "all"), ("mean", "all"), ("counterfactual", "end"),
                                                ("mean", "end")])
def test_faithfulness_equals_a_direct_computation(tiny, ablation, positions):
    model, pairs = tiny
    names = components(model)
    assert len(names) == 3 * 4 + 3
    # scores with ties broken by nothing but their values: a0.h0 highest, then on down the model
    scores = {name: float(len(names) - i) for i, name in enumerate(names)}
    curve = faithfulness(model, pairs, scores, ablation=ablation, mean="global", batch_size=5, progress=False,
                         positions=positions)
    direct = "counterfactual" if ablation == "counterfactual" else "mean-global"
    end = positions == "end"
    full, empty = _direct_metric(model, pairs, None, direct, end), _direct_metric(model, pairs, set(), direct, end)
    assert curve.m_full == pytest.approx(full, abs=1e-6)
    assert curve.m_empty == pytest.approx(empty, abs=1e-6)
    assert abs(full - empty) > 1e-3  # the ablation changes the metric, so f is a real ratio
    assert curve.sizes == [int(p * 15) for p in PERCENTAGES]
    f = []
    for k, kept in zip(curve.sizes, curve.circuits):
        assert kept == names[:k]
        f.append((_direct_metric(model, pairs, set(kept), direct, end) - empty) / (full - empty))
    assert curve.f == pytest.approx(f, abs=1e-6)
    assert curve.f[-1] == pytest.approx(1.0, abs=1e-6)  # every component kept: the whole model
    assert curve.cpr == pytest.approx(np.trapezoid(f, PERCENTAGES), abs=1e-6)
    assert curve.cmd == pytest.approx(np.trapezoid([abs(1 - v) for v in f], PERCENTAGES), abs=1e-6)


def test_the_empty_circuit_scores_zero_and_batching_does_not_matter(tiny):
    model, pairs = tiny
    one, _ = measure(model, pairs, [None, set(), {"a0.h1", "m2"}], batch_size=1, progress=False)
    many, n = measure(model, pairs, [None, set(), {"a0.h1", "m2"}], batch_size=12, progress=False)
    assert n == 12
    assert many == pytest.approx(one, abs=1e-6)


def test_bad_ablation_or_metric_is_refused(tiny):
    model, pairs = tiny
    with pytest.raises(ValueError, match="ablation"):
        measure(model, pairs, [None], ablation="zero", progress=False)
    with pytest.raises(ValueError, match="metric"):
        measure(model, pairs, [None], metric="kl", progress=False)
    with pytest.raises(ValueError, match="positions"):
        measure(model, pairs, [None], positions="first", progress=False)


def test_command_writes_the_curve_and_takes_an_edge_level_graph(tiny, tmp_path, monkeypatch, capsys):
    """`keyheads faithfulness` on an EAP-IG edge-level file (edge scores only): its nodes are ranked by the |score| they
    send on, and the curve it writes is the one the Python API gives for those scores."""
    import json

    from keyheads.circuits import edge_names
    from keyheads.cli import main

    model, pairs = tiny
    monkeypatch.setattr("keyheads.models.loading.load_model", lambda *a, **k: model)
    sent = {"a1.h2": 3.0, "m0": 2.0, "a0.h3": 1.0}
    edges = {}
    for name, parent, _child in edge_names(3, 4, False):
        edges[name] = {"score": sent.get(parent, 0.0) if name.endswith("logits") else 0.0, "in_graph": False}
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps({"cfg": {"n_layers": 3, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 8},
                                 "nodes": {n: {"in_graph": False} for n in ["input", *components(model), "logits"]},
                                 "edges": edges}))
    out = tmp_path / "out"
    assert main(["faithfulness", "--model", "tiny", "--circuit", str(graph), "--data", str(pairs), "--out", str(out),
                 "--quiet"]) == 0
    written = json.loads((out / "faithfulness.json").read_text())
    assert (out / "faithfulness.png").stat().st_size > 1000
    assert written["circuits"][-1][:3] == ["a1.h2", "m0", "a0.h3"]
    scores = {n: -abs(sent.get(n, 0.0)) for n in components(model)}  # as keyheads reads a foreign graph
    want = faithfulness(model, pairs, scores, progress=False)
    assert written["f"] == pytest.approx(want.f, abs=1e-9)
    assert written["cpr"] == pytest.approx(want.cpr) and written["cmd"] == pytest.approx(want.cmd)
    assert "CPR (area under f)" in capsys.readouterr().out


def test_command_gives_the_faithfulness_of_a_graph_that_marks_a_circuit_without_scores(tiny, tmp_path, monkeypatch,
                                                                                      capsys):
    """A MIB file with in_graph nodes and no scores: no curve to draw, the one circuit's f; one marking nothing is
    refused."""
    import json

    from keyheads.cli import main

    model, pairs = tiny
    monkeypatch.setattr("keyheads.models.loading.load_model", lambda *a, **k: model)
    cfg = {"n_layers": 3, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 8}
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps({"cfg": cfg, "nodes": {"a0.h1": {"in_graph": True}, "m2": {"in_graph": True},
                                                       "a1.h0": {"in_graph": False}}, "edges": {}}))
    out = tmp_path / "o"
    assert main(["faithfulness", "--model", "tiny", "--circuit", str(graph), "--data", str(pairs),
                 "--out", str(out)]) == 0
    written = json.loads((out / "faithfulness.json").read_text())
    (full, empty, m), _ = measure(model, pairs, [None, set(), {"a0.h1", "m2"}], progress=False)
    assert written["components"] == ["a0.h1", "m2"]
    assert written["f"] == pytest.approx((m - empty) / (full - empty), abs=1e-9)
    assert "f(C) =" in capsys.readouterr().out
    graph.write_text(json.dumps({"cfg": cfg, "nodes": {"a0.h1": {"in_graph": False}}, "edges": {}}))
    assert main(["faithfulness", "--model", "tiny", "--circuit", str(graph), "--data", str(pairs),
                 "--out", str(out)]) == 2
    assert "marks none in_graph" in capsys.readouterr().err
