"""`keyheads knockout` and `attention` take their heads from MIB / EAP-IG circuit files written by hand to the
published schema (EAP-IG Graph.to_json), for the tiny 3-layer x 4-head llama."""
import json

import pytest

from keyheads.cli import main

CFG = {"n_layers": 3, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 64}


@pytest.fixture
def run(monkeypatch, llama):
    monkeypatch.setattr("keyheads.commands.analysis.load_from_args", lambda args: llama)
    return main


@pytest.fixture
def eap_graph(tmp_path):
    """An edge-level circuit: heads 0.2 and 2.1 (and MLP 1) in the graph; readers take any subset of edges."""
    path = tmp_path / "circuit.json"
    path.write_text(json.dumps({
        "cfg": CFG,
        "nodes": {"input": {"in_graph": True}, "a0.h2": {"in_graph": True}, "a1.h1": {"in_graph": False},
                  "m1": {"in_graph": True}, "a2.h1": {"in_graph": True}, "logits": {"in_graph": True}},
        "edges": {"input->a0.h2<q>": {"score": 0.3, "in_graph": True},
                  "a0.h2->m1": {"score": 0.2, "in_graph": True},
                  "m1->a2.h1<v>": {"score": -0.4, "in_graph": True},
                  "a2.h1->logits": {"score": 0.9, "in_graph": True},
                  "a1.h1->logits": {"score": 0.01, "in_graph": False}}}))
    return path


@pytest.fixture
def mib_nodes(tmp_path):
    """A node-level file: |score| ranks 2.0 (positive), 1.3, 0.0 first; 1.2 not scored."""
    nodes = {"input": {"in_graph": True, "score": float("nan")}}
    scores = {(2, 0): 0.8, (1, 3): -0.5, (0, 0): 0.3, (1, 2): float("nan")}
    for layer in range(3):
        for head in range(4):
            nodes[f"a{layer}.h{head}"] = {"in_graph": False, "score": scores.get((layer, head), 0.01 * head)}
        nodes[f"m{layer}"] = {"in_graph": False, "score": 0.0}
    nodes["logits"] = {"in_graph": True}
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"cfg": CFG, "nodes": nodes, "edges": {"input->m0": {"score": 0, "in_graph": False}}}))
    return path


def key_heads(out):
    return json.loads((out / "knockout.json").read_text())["key_heads"]["heads"]


def test_knockout_of_an_eap_ig_graph(run, tmp_path, pairs_file, eap_graph):
    out = tmp_path / "ko"
    assert run(["knockout", "--data", str(pairs_file), "--heads", str(eap_graph), "--out", str(out),
                "--no-transfer", "--quiet"]) == 0
    assert key_heads(out) == [{"layer": 0, "head": 2}, {"layer": 2, "head": 1}]


def test_knockout_of_mib_node_scores(run, tmp_path, pairs_file, mib_nodes):
    out = tmp_path / "ko"
    assert run(["knockout", "--data", str(pairs_file), "--effects", str(mib_nodes), "--top-k", "3", "-k", "4",
                "--seeds", "1", "--out", str(out), "--no-transfer", "--quiet"]) == 0
    assert key_heads(out) == [{"layer": 2, "head": 0}, {"layer": 1, "head": 3}, {"layer": 0, "head": 0}]
    curves = json.loads((out / "knockout.json").read_text())["curves"]
    assert curves["effect_order"][:3] == key_heads(out)
    assert curves["effect_order"][3] == {"layer": 0, "head": 3}  # then |score| 0.03; 1.2 (not scored) last


def test_a_circuit_for_a_bigger_model_is_refused(run, tmp_path, pairs_file, eap_graph, capsys):
    data = json.loads(eap_graph.read_text())
    data["cfg"]["n_layers"] = 4
    data["nodes"]["a3.h0"] = {"in_graph": True}
    eap_graph.write_text(json.dumps(data))
    assert run(["knockout", "--data", str(pairs_file), "--heads", str(eap_graph), "--out", str(tmp_path / "ko"),
                "--no-transfer", "--quiet"]) == 2
    assert "head 3.0 does not exist: the model has 3 layers x 4 heads" in capsys.readouterr().err


def test_a_malformed_circuit_is_named_before_the_model_loads(run, tmp_path, pairs_file, eap_graph, capsys):
    data = json.loads(eap_graph.read_text())
    data["edges"]["a2.h1->a0.h2<q>"] = {"score": 0.0, "in_graph": True}
    eap_graph.write_text(json.dumps(data))
    assert run(["attention", "--data", str(pairs_file), "--heads", str(eap_graph), "--out", str(tmp_path / "a"),
                "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(eap_graph) in err and "edge 'a2.h1->a0.h2<q>' is not an edge" in err
