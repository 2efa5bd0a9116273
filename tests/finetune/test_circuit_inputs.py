"""`keyheads finetune --method precise` trains the heads of a MIB / EAP-IG circuit file written by hand to the
published schema (EAP-IG Graph.to_json), on the tiny 3-layer x 4-head llama folder."""
import json

import pytest

from keyheads.cli import main

from tests.finetune.test_cli import finetune_argv, info, tiny_folder, train_file  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # training runs through the CLI

CFG = {"n_layers": 3, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 64}


def trained(out):
    record = info(out)["components"]
    return [f"{h['layer']}.{h['head']}" for h in record["heads"]], record["mlps"]


def test_precise_sft_of_an_eap_ig_graph(tiny_folder, train_file, tmp_path):  # noqa: F811
    path = tmp_path / "circuit.json"
    path.write_text(json.dumps({
        "cfg": CFG,
        "nodes": {"input": {"in_graph": True}, "a1.h3": {"in_graph": True}, "a0.h0": {"in_graph": False},
                  "a2.h1": {"in_graph": True}, "m0": {"in_graph": True}, "logits": {"in_graph": True}},
        "edges": {"a1.h3->a2.h1<k>": {"score": 0.5, "in_graph": True},
                  "a2.h1->logits": {"score": 0.2, "in_graph": True}}}))
    out = tmp_path / "ft"
    assert main(finetune_argv(tiny_folder, train_file, out, "--heads", str(path))) == 0
    assert trained(out) == (["1.3", "2.1"], [])


def test_precise_sft_of_mib_node_scores(tiny_folder, train_file, tmp_path):  # noqa: F811
    nodes = {"input": {"in_graph": True, "score": float("nan")}}
    for layer in range(3):
        for head in range(4):
            nodes[f"a{layer}.h{head}"] = {"in_graph": False, "score": 0.01 * (4 * layer + head)}
        nodes[f"m{layer}"] = {"in_graph": False, "score": [0.1, -0.9, 0.3][layer]}
    nodes["a0.h1"]["score"], nodes["a2.h2"]["score"] = -1.5, 0.7
    nodes["logits"] = {"in_graph": True}
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"cfg": CFG, "nodes": nodes, "edges": {}}))
    out = tmp_path / "ft"
    assert main(finetune_argv(tiny_folder, train_file, out, "--effects", str(path), "--top-k", "2",
                              "--mlps", "1")) == 0
    assert trained(out) == (["0.1", "2.2"], [1])
