"""MIB / EAP-IG circuit graphs and TransformerLens hook names (keyheads.circuits): files written by hand to the
published schema (EAP-IG src/eap/graph.py Graph.to_json / from_json) are read; `keyheads export` writes that
schema and reads back unchanged; a malformed file is an error naming the file and the problem."""
import json
import math
from pathlib import Path

import pytest

from keyheads import circuits
from keyheads.cli import main
from keyheads.components import Components
from keyheads.effects import Effects
from keyheads.errors import BadFile
from keyheads.heads import Head, read_heads
from keyheads.io import write_json
from keyheads.results.identify import KeyHeads
from keyheads.testing.eap_ig import write_pt

# EAP-IG's Graph.from_model for 2 layers x 2 heads, sequential attention then MLP, typed out from its loops:
# into layer 0's heads, layer 0's MLP, layer 1's heads, layer 1's MLP, then the logits.
NODES_2X2 = ["input", "a0.h0", "a0.h1", "m0", "a1.h0", "a1.h1", "m1", "logits"]
EDGES_2X2 = """
input->a0.h0<q> input->a0.h0<k> input->a0.h0<v> input->a0.h1<q> input->a0.h1<k> input->a0.h1<v>
input->m0 a0.h0->m0 a0.h1->m0
input->a1.h0<q> input->a1.h0<k> input->a1.h0<v> input->a1.h1<q> input->a1.h1<k> input->a1.h1<v>
a0.h0->a1.h0<q> a0.h0->a1.h0<k> a0.h0->a1.h0<v> a0.h0->a1.h1<q> a0.h0->a1.h1<k> a0.h0->a1.h1<v>
a0.h1->a1.h0<q> a0.h1->a1.h0<k> a0.h1->a1.h0<v> a0.h1->a1.h1<q> a0.h1->a1.h1<k> a0.h1->a1.h1<v>
m0->a1.h0<q> m0->a1.h0<k> m0->a1.h0<v> m0->a1.h1<q> m0->a1.h1<k> m0->a1.h1<v>
input->m1 a0.h0->m1 a0.h1->m1 m0->m1 a1.h0->m1 a1.h1->m1
input->logits a0.h0->logits a0.h1->logits m0->logits a1.h0->logits a1.h1->logits m1->logits
""".split()


def test_node_and_edge_names_follow_eap_ig_order():
    assert circuits.node_names(2, 2) == NODES_2X2
    assert [name for name, _, _ in circuits.edge_names(2, 2, parallel_attn_mlp=False)] == EDGES_2X2
    parallel = [name for name, _, _ in circuits.edge_names(2, 2, parallel_attn_mlp=True)]
    # a parallel block's MLP does not read its own layer's heads: the four a{L}.h*->m{L} edges go
    assert sorted(parallel) == sorted(set(EDGES_2X2) - {"a0.h0->m0", "a0.h1->m0", "a1.h0->m1", "a1.h1->m1"})
    # MIB's GPT-2 small circuits (circuits/ioi-eap-ig.json) have 158 nodes and 32491 edges
    assert (len(circuits.node_names(12, 12)), len(circuits.edge_names(12, 12, False))) == (158, 32491)


def _hand_graph(in_graph=("a1.h0",), scores=None):
    """A 2x2 EAP-IG edge-level graph as its to_json writes it; with `scores`, a node-level one."""
    nodes = {}
    for name in NODES_2X2:
        nodes[name] = {"in_graph": name in in_graph or name in ("input", "logits")}
        if scores is not None and name != "logits":
            nodes[name]["score"] = scores.get(name, math.nan)
    edges = {name: {"score": 0.5, "in_graph": False} for name in EDGES_2X2}
    return {"cfg": {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 8}, "nodes": nodes,
            "edges": edges}


def test_a_hand_written_graph_gives_its_heads(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(_hand_graph(in_graph=("a1.h1", "a0.h0", "m0"))))
    assert read_heads(str(path)) == [Head(0, 0), Head(1, 1)]


def test_old_mib_files_with_bare_bool_nodes_read(tmp_path):
    data = _hand_graph()
    data["nodes"] = {name: name == "a0.h1" for name in NODES_2X2}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    assert read_heads(str(path)) == [Head(0, 1)]


def test_node_scores_rank_by_absolute_score(tmp_path):
    # NaN is written as EAP-IG's json.dump writes it: an unscored node, ranked last and never chosen
    text = json.dumps(_hand_graph(scores={"a0.h0": 0.01, "a0.h1": -0.3, "a1.h0": 0.7, "m0": -0.2, "m1": 0.05}))
    assert "NaN" in text
    path = tmp_path / "nodes.json"
    path.write_text(text)
    effects = Effects.load(path)
    assert effects.heads == [[-0.01, -0.3], [-0.7, effects.heads[1][1]]] and math.isnan(effects.heads[1][1])
    assert effects.mlps == [-0.2, -0.05]
    assert Components.select(effects, top_k=2).heads == (Head(1, 0), Head(0, 1))
    assert Components.select(effects, threshold=-0.1).heads == (Head(1, 0), Head(0, 1))
    assert Components.select(effects, top_k=1, n_mlps=1).mlps == (0,)


def _bad(tmp_path, mutate):
    data = _hand_graph(scores={"a0.h0": 0.1})
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("mutate, says", [
    (lambda d: d.pop("cfg"), "no 'cfg'"),
    (lambda d: d["cfg"].update(n_heads="2"), "cfg.n_heads must be a positive integer"),
    (lambda d: d["nodes"].update({"a0.x1": {"in_graph": True}}), "node 'a0.x1' is not one of"),
    (lambda d: d["nodes"].update({"a2.h0": {"in_graph": True}}), "outside the graph's cfg of 2 layers x 2 heads"),
    (lambda d: d["nodes"].update({"a0.h1": {"score": 1.0}}), "node 'a0.h1': expected"),
    (lambda d: d["nodes"]["a0.h1"].update(score="high"), "score must be a number"),
    (lambda d: d["edges"].update({"a1.h0->a0.h0<q>": {"score": 0, "in_graph": True}}), "edge 'a1.h0->a0.h0<q>'"),
    (lambda d: d["edges"].update({"input->m0": {"score": 0}}), "edge 'input->m0': expected"),
])
def test_a_malformed_graph_is_named(tmp_path, mutate, says):
    path = _bad(tmp_path, mutate)
    for read in (lambda: read_heads(str(path)), lambda: Effects.load(path)):
        with pytest.raises(BadFile) as err:
            read()
        assert str(path) in str(err.value) and says in str(err.value)


def test_a_graph_without_heads_or_scores_says_what_to_give(tmp_path):
    path = tmp_path / "g.json"
    data = _hand_graph(in_graph=("m0",))
    for edge in data["edges"].values():
        edge["score"] = 0.0
    path.write_text(json.dumps(data))
    with pytest.raises(BadFile, match="no attention-head node"):
        read_heads(str(path))
    with pytest.raises(BadFile, match="no node or edge scores.*--heads"):
        Effects.load(path)


def _edge_level(seed: int = 0) -> dict:
    """An EAP-IG edge-level file as its to_json writes it: no node scores; edge scores; some edges in the graph
    (the ends of in-graph edges, and only they, marked in_graph)."""
    import random

    rng = random.Random(seed)
    data = _hand_graph(in_graph=())
    for edge in data["edges"].values():
        edge["score"] = rng.uniform(-1, 1)
    for name in ("input->a0.h1<q>", "a0.h1->m0", "m0->a1.h0<v>", "a1.h0->logits"):
        data["edges"][name]["in_graph"] = True
    for node in ("a0.h1", "m0", "a1.h0"):
        data["nodes"][node]["in_graph"] = True
    return data


def test_an_edge_level_graph_scores_each_node_by_what_it_sends(tmp_path):
    data = _edge_level()
    path = tmp_path / "edges.json"
    path.write_text(json.dumps(data))
    circuit = circuits.read_graph(data)
    assert circuit.heads == [(0, 1), (1, 0)] and circuit.mlps == [0]
    # the rule, computed directly: the sum of |score| over the edges a node sends
    for layer in range(2):
        for head in range(2):
            sent = sum(abs(v["score"]) for name, v in data["edges"].items() if name.startswith(f"a{layer}.h{head}->"))
            assert circuit.head_scores[layer][head] == pytest.approx(sent)
        assert circuit.mlp_scores[layer] == pytest.approx(
            sum(abs(v["score"]) for name, v in data["edges"].items() if name.startswith(f"m{layer}->")))
    effects = Effects.load(path)
    assert effects.heads[0][1] == pytest.approx(-circuit.head_scores[0][1])
    assert read_heads(str(path)) == [Head(0, 1), Head(1, 0)]
    # a file whose nodes mark nothing: the ends of its in-graph edges
    for node in data["nodes"].values():
        node["in_graph"] = False
    assert circuits.read_graph(data).heads == [(0, 1), (1, 0)] and circuits.read_graph(data).mlps == [0]


def test_a_neuron_mask_is_refused_not_dropped(tmp_path):
    data = _hand_graph(in_graph=("a0.h1",))
    data["nodes"]["a0.h1"]["neurons"] = [True, False, True, True]
    path = tmp_path / "neurons.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadFile, match="keeps 3 of its 4 neurons"):
        read_heads(str(path))
    data["nodes"]["a0.h1"]["neurons"] = [True] * 4  # every neuron: the node whole
    path.write_text(json.dumps(data))
    assert read_heads(str(path)) == [Head(0, 1)]


def test_a_pt_graph_reads_as_its_json(tmp_path):
    data = _edge_level(seed=1)
    write_pt(data, tmp_path / "g.pt")
    got = circuits.load_graph_file(tmp_path / "g.pt")
    assert got["nodes"] == {n: {"in_graph": v["in_graph"]} for n, v in data["nodes"].items() if n != "logits"}
    assert got["edges"].keys() == data["edges"].keys()
    assert all(got["edges"][k]["in_graph"] == v["in_graph"] and got["edges"][k]["score"] == pytest.approx(v["score"])
               for k, v in data["edges"].items())
    assert read_heads(str(tmp_path / "g.pt")) == [Head(0, 1), Head(1, 0)]
    from_pt, from_json = Effects.load(tmp_path / "g.pt").heads, Effects.load(_write(tmp_path, data)).heads
    assert sum(from_pt, []) == pytest.approx(sum(from_json, []))
    (tmp_path / "bad.pt").write_bytes(b"not a pickle")
    with pytest.raises(BadFile, match="bad.pt"):
        read_heads(str(tmp_path / "bad.pt"))


def _write(tmp_path, data) -> Path:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    return path


def test_a_graph_for_another_model_shape_is_refused(tmp_path):
    class Model:
        name, n_layers, n_heads = "tiny", 3, 4
    path = tmp_path / "g.json"
    path.write_text(json.dumps(_hand_graph(scores={"a0.h0": 0.1})))
    with pytest.raises(BadFile, match="2 layers x 2 heads but tiny has 3 x 4"):
        Effects.load(path, Model())


# ---- keyheads export --------------------------------------------------------------------------------------

@pytest.fixture
def identify(tmp_path):
    """An identify folder of a 3-layer x 4-head model: key heads 2.3, 0.1 (the two below -0.2), MLPs 1 then 2."""
    heads = [[0.01, -0.25, 0.03, 0.0], [0.02, -0.05, 0.4, -0.1], [0.0, -0.01, -0.15, -0.6]]
    effects = Effects(metric="relative-logit", method="path", model="tiny", n_samples=4, n_excluded=1,
                      data_sha256="ab", heads=heads, mlps=[0.1, -0.7, -0.3],
                      heads_sem=[[0.001 * (i + j) for j in range(4)] for i in range(3)], mlps_sem=[0.01, 0.02, 0.03])
    folder = tmp_path / "identify"
    folder.mkdir()
    effects.write(folder / "effects.json")
    write_json(folder / "key_heads.json", KeyHeads.chosen(effects, threshold=-0.2).model_dump())
    return folder


def test_export_round_trips(identify, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(identify), "--out", str(out), "--mlps", "1", "--d-model", "64",
                 "--no-parallel-attn-mlp"]) == 0
    graph = json.loads((out / "circuit.json").read_text())
    assert set(graph) == {"cfg", "nodes", "edges", "keyheads"}
    assert graph["cfg"] == {"n_layers": 3, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 64}
    assert list(graph["nodes"]) == circuits.node_names(3, 4)
    assert graph["nodes"]["logits"] == {"in_graph": True}  # EAP-IG's writer and reader fail on a logits score
    assert graph["nodes"]["a1.h2"] == {"in_graph": False, "score": -0.4}  # MIB's convention: higher, more important
    assert graph["keyheads"]["heads"][1][2] == 0.4  # the effect itself, under keyheads' key
    assert [n for n, v in graph["nodes"].items() if v["in_graph"]] == ["input", "a0.h1", "m1", "a2.h3", "logits"]
    chosen = {"input", "a0.h1", "m1", "a2.h3", "logits"}
    assert len(graph["edges"]) == len(circuits.edge_names(3, 4, False))
    score = {n: v.get("score") for n, v in graph["nodes"].items()}
    for name, value in graph["edges"].items():  # in the graph when both ends are; scored by the lesser end
        parent, child = name.split("->")
        child = child.split("<")[0]
        ends = [score[n] for n in (parent, child) if n not in ("input", "logits")]
        assert value == {"score": min(ends) if ends else 0.0, "in_graph": parent in chosen and child in chosen}, name
    text = (out / "circuit.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))  # null, never NaN
    # read back: the same effects (scores with their sign), the same key heads
    assert Effects.load(out / "circuit.json") == Effects.load(identify / "effects.json")
    assert read_heads(str(out / "circuit.json")) == [Head(0, 1), Head(2, 3)]
    hooks = json.loads((out / "hooks.json").read_text())
    assert hooks["heads"][0]["name"] == "blocks.2.attn.hook_result[:, :, 3]"
    assert hooks["mlps"] == [{"layer": 1, "node": "m1", "hook": "blocks.1.hook_mlp_out"}]
    assert read_heads(str(out / "hooks.json")) == [Head(2, 3), Head(0, 1)]  # key-head order
    assert "2 key heads and 1 MLPs" in capsys.readouterr().out


def _apply_topn(graph: dict, n: int) -> list[str]:
    """EAP-IG's Graph.apply_topn(n, absolute=False), transcribed on the JSON: the logits node starts in the graph;
    the highest-scored edge into a node in the graph goes in, its parent with it, whose own incoming edges then
    become candidates. -> the nodes in the order they enter."""
    import heapq

    edges = [(name.split("->")[0], name.split("->")[1].split("<")[0], v["score"]) for name, v in graph["edges"].items()]
    into: dict[str, list] = {}
    for parent, child, score in edges:
        into.setdefault(child, []).append((-score, parent, child))
    heap = list(into["logits"])
    heapq.heapify(heap)
    entered, order = {"logits"}, []
    for _ in range(n):
        _, parent, _ = heapq.heappop(heap)
        if parent not in entered:
            entered.add(parent)
            order.append(parent)
            for item in into.get(parent, []):
                heapq.heappush(heap, item)
    return order


def test_mib_s_top_n_takes_the_key_heads_first(identify, tmp_path):
    out = tmp_path / "export"
    assert main(["export", str(identify), "--out", str(out), "--d-model", "64", "--no-parallel-attn-mlp"]) == 0
    graph = json.loads((out / "circuit.json").read_text())
    first = [n for n in _apply_topn(graph, 40) if n.startswith("a")][:2]
    assert first == ["a2.h3", "a0.h1"]  # the key heads, most negative effect first


def test_export_needs_the_model_width(identify, tmp_path, capsys):
    assert main(["export", str(identify), "--out", str(tmp_path / "x")]) == 2
    assert "no model.json" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_export_reads_a_run_folder_and_its_models_config(identify, tmp_path):
    from keyheads.testing import tiny_model

    model = tiny_model("gpt_neox")  # attention and MLP in parallel
    model.hf.save_pretrained(tmp_path / "m")
    run = tmp_path / "run"
    identify.rename(run.mkdir() or run / "identify")
    write_json(run / "model.json", {"name": "m", "source": str(tmp_path / "m"), "fingerprint": "x", "n_layers": 3,
                                    "n_heads": 4, "dtype": "float32", "device": "cpu"})
    assert main(["export", str(run), "--out", str(tmp_path / "e")]) == 0
    cfg = json.loads((tmp_path / "e" / "circuit.json").read_text())["cfg"]
    assert cfg == {"n_layers": 3, "n_heads": 4, "parallel_attn_mlp": True, "d_model": model.d_model}
