"""`keyheads run` takes a circuit found by another tool (`circuit: FILE`): the identify stage writes its effects and
key heads from the file instead of patching, and the knockout and precise SFT work on those heads. Files are
written by hand to the EAP-IG / MIB graph schema, for the tiny 3-layer x 4-head llama."""
import json
import math

import pytest

from keyheads.config.run import RunSettings
from keyheads.errors import BadFile, SettingError
from keyheads.pipeline import run_pipeline
from keyheads.testing import tiny_model

from tests.helpers import make_rows, write_rows

pytestmark = pytest.mark.slow  # pipelines of a few stages, a few seconds each

CFG = {"n_layers": 3, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 64}
SCORES = {(2, 1): 0.9, (0, 2): -0.6, (1, 3): 0.4, (1, 0): 0.2}  # |score| ranks 2.1, 0.2, 1.3, 1.0


def graph(path, in_graph=(), mlps=(), scored=True):
    nodes = {"input": {"in_graph": True}}
    for layer in range(3):
        for head in range(4):
            nodes[f"a{layer}.h{head}"] = {"in_graph": (layer, head) in in_graph}
            if scored:
                nodes[f"a{layer}.h{head}"]["score"] = SCORES.get((layer, head), 0.01 * head)
        nodes[f"m{layer}"] = {"in_graph": layer in mlps, **({"score": 0.1 * layer} if scored else {})}
    nodes["logits"] = {"in_graph": True}
    path.write_text(json.dumps({"cfg": CFG, "nodes": nodes, "edges": {"input->m0": {"score": 0, "in_graph": True}}}))
    return path


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setattr("keyheads.models.loading.load_model", lambda *a, **k: tiny_model("llama"))
    monkeypatch.setattr("keyheads.pipeline._data", lambda cfg, run, model, progress=True:
                        write_rows(run.pairs, make_rows(16)))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"prompt": f"{a} + 1 = ", "completion": str(a + 1)})
                                                  + "\n" for a in range(8)))
    return tmp_path


def settings(tmp_path, circuit, **kw):
    return RunSettings.make(model="tiny", out=str(tmp_path / "run"), circuit=str(circuit), identify=dict(top_k=3),
                            knockout=dict(k=3, seeds=2, limit=None, transfer=False), variants=["precise"],
                            finetune=dict(train=str(tmp_path / "train.jsonl"), max_steps=1, optimizer_batch_size=4,
                                          micro_batch_size=2), eval=dict(benchmarks=[]), batch_size=8, **kw)


def read(path):
    return json.loads(path.read_text())


def test_a_graph_s_heads_are_the_run_s_key_heads(run):
    circuit = graph(run / "circuit.json", in_graph={(0, 2), (2, 1)}, mlps={1})
    run_pipeline(settings(run, circuit), stages=["data", "identify", "knockout", "finetune"], progress=False)
    out = run / "run"
    keys = read(out / "identify" / "key_heads.json")
    assert [k["label"] for k in keys["heads"]] == ["2.1", "0.2"]  # in the graph, most negative effect first
    assert [m["layer"] for m in keys["mlps"]] == [1]
    effects = read(out / "identify" / "effects.json")
    assert effects["heads"][2][1] == -0.9 and effects["heads"][0][2] == -0.6  # node scores enter as -|score|
    assert read(out / "knockout" / "knockout.json")["key_heads"]["heads"] == [{"layer": 2, "head": 1},
                                                                             {"layer": 0, "head": 2}]
    trained = read(out / "finetune" / "precise" / "finetune.json")["components"]["heads"]
    assert sorted((h["layer"], h["head"]) for h in trained) == [(0, 2), (2, 1)]


def test_node_scores_alone_are_ranked_by_the_run_s_rule(run):
    circuit = graph(run / "nodes.json")  # nothing in_graph: identify.top_k 3 picks by |score|
    run_pipeline(settings(run, circuit), stages=["data", "identify"], progress=False)
    keys = read(run / "run" / "identify" / "key_heads.json")
    assert [k["label"] for k in keys["heads"]] == ["2.1", "0.2", "1.3"]
    assert keys["heads"][0]["effect"] == -0.9 and not math.isnan(keys["heads"][2]["effect"])


def test_a_changed_circuit_file_runs_identify_again(run):
    circuit = graph(run / "circuit.json", in_graph={(0, 2)})
    run_pipeline(settings(run, circuit), stages=["data", "identify"], progress=False)
    graph(circuit, in_graph={(1, 3)})
    run_pipeline(settings(run, circuit), stages=["data", "identify"], progress=False)
    assert [k["label"] for k in read(run / "run" / "identify" / "key_heads.json")["heads"]] == ["1.3"]


def test_a_circuit_without_scores_takes_its_effects_from_keyheads_own_patching(run, caplog):
    unscored = graph(run / "unscored.json", in_graph={(0, 2), (1, 3)}, scored=False)
    said = []
    run_pipeline(settings(run, unscored), stages=["data", "identify"], progress=False, say=said.append)
    keys = read(run / "run" / "identify" / "key_heads.json")
    assert sorted(k["label"] for k in keys["heads"]) == ["0.2", "1.3"]  # the graph's heads
    assert any("has no scores: the effects are keyheads' own path patching" in s for s in said)
    patched = run / "patched"
    run_pipeline(RunSettings.make(**{**settings(run, unscored).to_json(), "circuit": None, "out": str(patched)}),
                 stages=["data", "identify"], progress=False)
    assert read(run / "run" / "identify" / "effects.json")["heads"] == read(patched / "identify" / "effects.json")[
        "heads"]


def test_a_circuit_of_another_shape_or_missing_is_refused(run):
    wide = run / "wide.json"
    data = read(graph(wide))
    data["cfg"]["n_heads"] = 8
    data["nodes"] |= {f"a{layer}.h{head}": {"in_graph": False, "score": 0.0} for layer in range(3)
                      for head in range(4, 8)}
    wide.write_text(json.dumps(data))
    with pytest.raises(BadFile, match="wide.json"):
        run_pipeline(settings(run, wide), stages=["data", "identify"], progress=False)
    with pytest.raises(SettingError, match="circuit"):
        settings(run, run / "nowhere.json")


def test_a_run_without_a_circuit_keeps_its_identify_signature(run):
    """Run folders made before `circuit` existed stay up to date: without one, identify's settings are the
    model and the patch section alone."""
    from keyheads.pipeline import build_stages

    cfg = RunSettings.make(model="tiny", out=str(run / "run"), eval=dict(benchmarks=[]))
    identify = next(s for s in build_stages(cfg, run / "run", get_model=lambda: None) if s.name == "identify")
    assert identify.settings == {"model": "tiny", "dtype": cfg.dtype, **cfg.identify.to_json()}
    circuit = graph(run / "circuit.json", in_graph={(0, 2)})
    with_circuit = next(s for s in build_stages(settings(run, circuit), run / "run", get_model=lambda: None)
                        if s.name == "identify")
    assert with_circuit.settings["circuit"] == str(circuit) and len(with_circuit.settings["circuit_sha256"]) == 64
