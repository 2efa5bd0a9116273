"""Every bench script runs to its end in its tiny mode (bench/tiny.py: a tiny random model, a handful of samples,
one repetition), as `python -m bench.NAME` from the repository's root, and writes what it measured to a temporary
file, never to bench/RESULTS.md. Each run must exit 0 and leave the rows its section always has.

Which path each script runs here, on the CPU:
- patching, analysis, eval, finetune, knockout_rows, integration: their CPU path, whole (eval and knockout_rows on
  the hand-made benchmark folder); analysis's and eval's --gpu parts (analysis_gpu, eval_gpu) need CUDA and are
  left out, as is finetune's --random-init on a GPU;
- patching_scale: its one path, on the CPU with a tiny shape where a run times a 7B shape on a GPU;
- fsdp: its `cpu` part, DDP and FSDP2 on two processes under torch.distributed.run, whose processes are
  bench.fsdp_worker (its GPU parts need a GPU); fsdp_memory: both of its two-process launches;
- plan_table: the planner's arithmetic, whole (it loads no model);
- paper_gpu: its record-reading paths, `report DIR` on a committed record folder and `report-records` (which is
  bench.paper_gpu_records' main) into copies of README.md and bench/RESULTS.md; `run` needs a GPU machine and the
  .gpu/ folder `prepare` fills from the network.
gpu_wheels.sh is left out: a shell script that downloads wheels. results, floors, tiny and paper_gpu_setup run
nothing of their own (tests/test_bench.py imports every module of bench/).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import paper_gpu, paper_gpu_records
from bench import results as bench_results
from bench.results import RESULTS

pytestmark = pytest.mark.slow  # each run starts Python and torch; the two-process ones take about 30 s

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "records" / "paper-llama2-7b-gpu" / "2026-11-27-c1-d"


@pytest.fixture(autouse=True)
def results_md_unchanged():
    before = RESULTS.read_bytes()
    yield
    assert RESULTS.read_bytes() == before, "a tiny run wrote into bench/RESULTS.md"


def run(module: str, *args, tmp: Path) -> None:
    """`python -m bench.MODULE ARGS` from the repository's root, its temporary files under `tmp`, which must exit 0.
    One thread a process: a check needs no speed, and idle threads spin on a busy machine."""
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", f"bench.{module}", *map(str, args)], cwd=ROOT, text=True,
                          capture_output=True, timeout=600, env=env)
    assert proc.returncode == 0, \
        f"bench.{module} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def section(path: Path, starts: str) -> str:
    """The body of the one `## ` section of a RESULTS file whose title starts with `starts`."""
    found = re.findall(rf"^## {re.escape(starts)}.*?\n(.*?)(?=^## |\Z)", path.read_text(), re.S | re.M)
    assert len(found) == 1, f"{path}: {len(found)} sections titled {starts}..."
    return found[0].strip()


def tiny(module: str, tmp_path: Path, *args) -> Path:
    """`python -m bench.MODULE --tiny ARGS`, its section written into a RESULTS file of its own: that file."""
    results = tmp_path / "RESULTS.md"
    run(module, "--tiny", "--results", results, *args, tmp=tmp_path)
    return results


def from_record(body: str, results: Path, name: str) -> None:
    """A measured section is its record's text: the record the script saved beside its RESULTS file."""
    record = json.loads((results.parent / "records" / f"{name}.json").read_text())
    assert body == bench_results.block(record) and record["figures"]


def test_patching_fast_sweep_equals_the_naive_loop(tmp_path):
    body = section(tiny("patching", tmp_path), "Path patching: naive loop vs fast sweep (bench/patching.py)")
    assert body.startswith("- script: bench/patching.py; commit ") and "command: `python -m bench.patching" in body
    assert "- naive loop (one forward per sender, 15 senders)" in body  # 3 layers x (4 heads + 1 MLP)
    assert float(re.search(r"largest \|fast - naive\|: \*\*(\S+)\*\*", body).group(1)) <= 1e-4


def test_analysis_batched_curves_equal_the_direct_ones_on_both_cases(tmp_path):
    body = section(tiny("analysis", tmp_path), "Knockout curves: direct vs batched END-only passes")
    from_record(body, tmp_path / "RESULTS.md", "analysis")
    assert "5 knockout sets per case" in body  # none, k = 1..2, one random order k = 1..2
    cases = [line.split("**")[1] for line in body.splitlines() if line.startswith("- **")]
    assert cases == ["demo", "shared-prefix"]
    assert body.count("accuracies identical at every point: **yes**") == 2


def test_eval_tables_the_engine_transformers_and_the_harness(tmp_path, tiny_data):
    body = section(tiny("eval", tmp_path, "--data-dir", tiny_data),
                   "Evaluation throughput: keyheads engine vs transformers generate")
    from_record(body, tmp_path / "RESULTS.md", "eval")
    rows = [line.split(" | ")[0] for line in body.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["| system", "| keyheads engine (greedy_generate, shared prefix, continuous batching)",
                    "| transformers generate (batched, left-padded)", "| lm-evaluation-harness HF backend"]
    assert "2 GSM8K test prompts" in body and "at most 16 new tokens" in body
    assert re.search(r"\*\*identical final texts: \d / 2\*\*", body)


def test_finetune_times_precise_sft_against_its_floor_each_in_its_own_process(tmp_path):
    body = section(tiny("finetune", tmp_path, "--scratch", tmp_path / "scratch"), "Fine-tuning speed and memory: ")
    cases = [line.split(" | ")[0].lstrip("| ") for line in body.splitlines() if line.startswith("| ")]
    assert cases == ["case", "floor", "precise"]
    assert "failed" not in body and "precise step / its floor: **" in body


def test_knockout_rows_times_the_base_and_the_knockout_row(tmp_path, tiny_data):
    body = section(tiny("knockout_rows", tmp_path, "--data-dir", tiny_data), "Knockout rows against base rows")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[2] for line in body.splitlines()
            if line.startswith("| base") or line.startswith("| knockout")}
    assert rows == {"base": "2", "knockout": "2"}  # items evaluated by each row


def test_integration_trains_the_same_heads_both_ways(tmp_path):
    out = tmp_path / "integration.json"
    run("integration", "--tiny", "--json", out, tmp=tmp_path)
    report = json.loads(out.read_text())
    assert set(report["summary"]) == {"keyheads finetune", "SFTTrainer + attach",
                                      "SFTTrainer + attach, no rescale/decay hooks"}
    assert all(side["mean_step_s"] > 0 for side in report["summary"].values())
    assert report["user_lines"]["added"] > 0 and report["deltas_max_relative_difference"] >= 0


def test_patching_scale_runs_its_sweep_on_the_cpu(tmp_path):
    body = section(tiny("patching_scale", tmp_path), "Path patching at tiny scale on one GPU")
    assert "2 layers x 4 heads" in body and "all effects finite: True" in body and "**fast / floor = " in body


def test_plan_table_gives_each_shape_its_table(tmp_path):
    body = section(tiny("plan_table", tmp_path), "What fits where: LLaMA-2 7B, 13B and 70B on 1 to 8 GPUs")
    for shape in ("7B", "13B", "70B"):
        assert f"**{shape}** (" in body
    assert body.count("| stage | 1 GPU | 2 GPUs | 4 GPUs | 8 GPUs |") == 3
    assert body.count("| full SFT | ") == 3


@pytest.mark.distributed
def test_fsdp_trains_full_sft_under_ddp_and_fsdp2_on_two_processes(tmp_path):
    body = section(tiny("fsdp", tmp_path, "cpu"), "Past one process on the CPU")
    rows = [line.split(" | ")[:3] for line in body.splitlines() if line.startswith("| full |")]
    assert rows == [["| full", "ddp", "2"], ["| full", "fsdp", "2"]]
    assert "Measured " in body and "with `python -m bench.fsdp cpu --tiny`" in body


@pytest.mark.distributed
def test_fsdp_memory_measures_both_ways_of_loading_on_both_processes(tmp_path):
    body = section(tiny("fsdp_memory", tmp_path, "--out", tmp_path / "work"), "FSDP2 on two CPU processes")
    from_record(body, tmp_path / "RESULTS.md", "fsdp_memory")
    rows = [tuple(line.split(" | ")[:2]) for line in body.splitlines() if line.startswith("| read") or
            line.startswith("| loaded")]
    assert rows == [("| read shard by shard (now)", "0"), ("| read shard by shard (now)", "1"),
                    ("| loaded whole first (before)", "0"), ("| loaded whole first (before)", "1")]


def test_paper_gpu_reports_a_committed_record_folder(tmp_path):
    results = tmp_path / "RESULTS.md"
    run("paper_gpu", "report", RECORD, "--results", results, tmp=tmp_path)
    body = section(results, "The paper config end to end on one GPU (bench/paper_gpu.py)")
    assert body.startswith(paper_gpu.RUN_BEGIN) and body.rstrip().endswith(paper_gpu.RUN_END)
    rows = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith(("| phase |", "| ---"))]
    assert len(rows) == len((RECORD / "stages.jsonl").read_text().splitlines())  # one row a stage


def test_paper_gpu_report_records_writes_readme_and_results_copies(tmp_path, shared_data):
    readme, results = tmp_path / "README.md", tmp_path / "RESULTS.md"
    readme.write_text(f"# a page\n\n{paper_gpu_records.README_BEGIN}\nold figures\n{paper_gpu_records.README_END}\n")
    run("paper_gpu", "report-records", "--data-dir", shared_data, "--readme", readme, "--results", results,
        tmp=tmp_path)
    block = paper_gpu_records.written(readme.read_text())
    assert "old figures" not in block and "What it costs (LLaMA-2-7B, bf16)." in block
    body = section(results, paper_gpu_records.PHASE_C_TITLE)
    assert body.startswith(paper_gpu_records.RESULTS_BEGIN)
    for folder in paper_gpu_records.record_folders():
        assert f"`records/paper-llama2-7b-gpu/{folder.name}`" in body
