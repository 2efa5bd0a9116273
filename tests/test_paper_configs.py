"""The LLaMA-2 paper config runs end to end under two FSDP2 processes (torchrun, gloo on the CPU), every stage
through the report, at a tiny size: a random model of the config's family with 64 heads (so that every
variant, top 8 to top 64, has its heads), its own settings otherwise, with only sizes cut by flags (pairs,
knockout draws and prompts, one training step, two items a benchmark). A random model answers nothing
correctly, so the data stage keeps every pair (--no-data.keep-correct) instead of the correct ones.
The Qwen config is checked against it without a run: the same settings and the same stages, its model apart.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import ByteLevelBPETokenizer
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

from keyheads.testing import char_tokenizer

from tests.helpers import write_tiny_benchmarks

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"paper-llama2-7b": LlamaConfig, "paper-qwen1.5b": Qwen2Config}
TINY = ["--data.n", "4", "--no-data.keep-correct", "--knockout.seeds", "1", "--knockout.limit", "8",
        "--knockout.transfer-n", "4", "--attention.limit", "8", "--mlp.limit", "8", "--finetune.max-steps", "1",
        "--eval.limit", "2", "--batch-size", "8", "--threads", "1", "--quiet"]

pytestmark = [pytest.mark.distributed, pytest.mark.slow,
              pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE, as Qwen's is: transformers loads any tokenizer beside a Qwen2 config as Qwen's
    (its pre-tokenizer, digits one by one), which needs a byte-level vocabulary."""
    bpe = ByteLevelBPETokenizer()
    # no merges: every word is its bytes, as with a character tokenizer, so the counterfactual pools always
    # hold words of an operator's token count
    bpe.train_from_iterator(["0 1 2 3 4 5 6 7 8 9"], vocab_size=257, min_frequency=1, special_tokens=["<|endoftext|>"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


def tiny_of(config_class, folder: Path) -> Path:
    tok = byte_level_tokenizer() if config_class is Qwen2Config else char_tokenizer()
    config = config_class(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                          num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory):
    name = "paper-llama2-7b"
    root = tmp_path_factory.mktemp(name)
    model = tiny_of(CONFIGS[name], root / "model")
    (root / "benchmarks").mkdir()
    write_tiny_benchmarks(root / "benchmarks", mmlu_subjects=("formal_logic", "astronomy"))  # a humanities one
    with open(root / "benchmarks" / "gsm8k" / "train.jsonl", "w") as f:  # training questions no test set holds
        for a in range(4):
            f.write(json.dumps({"question": f"Tom has {a + 2} pens and buys {a + 3} more. How many pens now?",
                                "answer": f"{a + 2} + {a + 3} = {2 * a + 5}\n#### {2 * a + 5}"}) + "\n")
    config = ROOT / "configs" / f"{name}.yaml"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
           "-m", "keyheads", "run", str(config), "--model", str(model), "--out", str(root / "run"),
           "--data-dir", str(root / "benchmarks"), "--device", "cpu", *TINY]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return yaml.safe_load(config.read_text()), root / "run"


def test_every_stage_ran_through_the_report(paper_run):
    config, run = paper_run
    stages = {p.stem for p in (run / "stages").glob("*.json")}  # a stage's record: its name, "/" as "--"
    assert {"data", "identify", "knockout", "attention", "mlp", "eval", "report"} <= stages
    assert {f"finetune--{v}" for v in config["variants"]} <= stages
    assert (run / "report.html").stat().st_size > 10_000


def test_the_config_is_the_papers_protocol(paper_run):
    config, run = paper_run
    used = json.loads((run / "config.json").read_text())
    assert used["data"]["single_token_answer"] is False and used["data"]["few_shot"] == 0  # first token, zero-shot
    assert used["identify"]["top_k"] == 32
    operations = ["addition", "subtraction", "multiplication", "division"]  # section 4.1; not exponentiation
    assert used["data"]["task"] == ",".join(operations)
    assert {json.loads(line)["task"] for line in (run / "pairs.jsonl").read_text().splitlines()} == set(operations)
    assert used["also_identify"] == [*operations, "exponentiation", "gsm8k"]  # figure 15, appendices D and E
    assert len(json.loads((run / "identify" / "key_heads.json").read_text())["heads"]) == 32
    recipe = {"lr": 2e-5, "optimizer_batch_size": 128, "epochs": 2.0, "warmup_ratio": 0.02, "weight_decay": 0.1,
              "rescale": True, "train": "trainset"}
    assert {k: used["finetune"][k] for k in recipe} == recipe
    assert used["eval"]["split"] == "full" and set(used["eval"]["benchmarks"]) == {
        "gsm8k", "addsub", "singleeq", "svamp", "mmlu", "csqa", "mmlu-humanities"}  # appendix E's MMLU-Humanities
    base, knockout = json.loads((run / "eval" / "results.json").read_text())["variants"][:2]
    for row in (base, knockout):  # its knockout against the base, on MMLU's items
        humanities = row["benchmarks"]["mmlu-humanities"]
        assert humanities["n"] == 2 and set(humanities["subjects"]) == {"formal_logic"}  # --eval.limit 2
        assert humanities["timing"]["cached"] >= 1  # the one MMLU's round robin took was scored by MMLU
    for variant in ("precise@32", "full", "lora", "random@32", "precise@8", "precise@64", "precise@32+mlp3"):
        assert variant in used["variants"]


def test_every_other_set_was_identified_and_reported(paper_run):
    config, run = paper_run
    for name in config["also_identify"]:
        assert (run / "stages" / f"identify--{name}.json").is_file(), name
        for file in ("pairs.jsonl", "effects.json", "key_heads.json", "heatmap.png"):
            assert (run / "identify" / name / file).is_file(), f"identify/{name}/{file}"
        assert len(json.loads((run / "identify" / name / "key_heads.json").read_text())["heads"]) == 32
    assert '<section id="identify-sets">' in (run / "report.html").read_text()


def test_training_ran_sharded_over_both_processes(paper_run):
    config, run = paper_run
    for variant in config["variants"]:
        info = json.loads((run / "finetune" / variant / "finetune.json").read_text())
        assert info["train"]["parallel"] == "fsdp" and info["train"]["processes"] == 2, variant


def test_the_table_has_base_knockout_and_every_variant(paper_run):
    config, run = paper_run
    rows = json.loads((run / "eval" / "results.json").read_text())["variants"]
    assert len(rows) == 2 + len(config["variants"])  # base, the key heads knocked out, each variant


def test_the_qwen_config_is_the_llama_run_but_its_model(tmp_path, tiny_data):
    """A dry run of the Qwen config against the LLaMA one that ran above: every setting but the model and the
    run folder is the same, and so is every stage the pipeline builds from it, in order, with its settings."""
    from keyheads.config.run import RunSettings
    from keyheads.pipeline import build_stages

    configs = {name: RunSettings.from_yaml(ROOT / "configs" / f"{name}.yaml", model="m", out=str(tmp_path / "run"),
                                         data_dir=str(tiny_data))
               for name in CONFIGS}
    llama, qwen = configs["paper-llama2-7b"], configs["paper-qwen1.5b"]
    assert llama == qwen
    for a, b in zip(build_stages(llama, tmp_path / "run", get_model=lambda: None),
                    build_stages(qwen, tmp_path / "run", get_model=lambda: None), strict=True):
        assert (a.name, a.settings, a.inputs, a.owns) == (b.name, b.settings, b.inputs, b.owns)
    raw = {name: yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text()) for name in CONFIGS}
    assert {k for k in raw["paper-llama2-7b"] if raw["paper-llama2-7b"][k] != raw["paper-qwen1.5b"][k]} == \
        {"model", "out"}
