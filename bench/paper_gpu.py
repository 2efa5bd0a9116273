"""The paper config (configs/paper-llama2-7b.yaml) end to end on one GPU, on a randomly initialised model of
LLaMA-2-7B's shape in bf16: each stage's time and peak GPU memory, with `keyheads plan`'s estimate beside it.

No weights travel: the model is built on the GPU machine from its config (seed 0) and saved as safetensors,
so loading, FSDP2's sharded read and every stage run as they would on the real model. The tokenizer is
SmolLM2's (LLaMA-2's is not at hand offline), so the vocabulary is 49,152 rows instead of 32,000 (6.88B
parameters instead of 6.74B). A random model answers nothing correctly, so the data stage keeps every pair
(--no-data.keep-correct); only sizes are cut (flags in SIZES), every setting of the protocol is the config's.

    python bench/paper_gpu.py prepare              # here: tokenizer, benchmark files, wheels into .gpu/
    python bench/paper_gpu.py run --out DIR        # on the GPU machine (carry .gpu): writes DIR/*.json*
    python bench/paper_gpu.py report DIR           # here: the RESULTS section from DIR
    python bench/paper_gpu.py report-records       # here: README's cost paragraph and RESULTS' phase C section,
                                                   # from the committed records (--check: only compare)

`run` goes in phases, each a `keyheads run` of the same run folder under torchrun (one process, FSDP2 as the
config says): A every stage with table 1's adapters except full SFT, B full SFT added (the planner puts it
at the GPU's edge), C table 2's head counts added. A phase starts only if its estimate fits the time left,
and every stage's figures are appended to DIR/stages.jsonl as it ends, so a cut-off run keeps what finished.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keyheads.planning.planner import Plan

ROOT = Path(__file__).resolve().parents[1]
PREPARED = ROOT / ".gpu"
CONFIG = ROOT / "configs" / "paper-llama2-7b.yaml"
SHAPES = {  # LlamaConfig fields; vocab_size is the tokenizer's
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32),
    "tiny": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=16,
                 num_key_value_heads=16),  # the same script on a CPU, to check it before GPU time is spent
}
BENCHMARK_FILES = ["gsm8k/train.jsonl", "gsm8k/test.jsonl", "addsub/AddSub.json", "singleeq/questions.json",
                   "svamp/SVAMP.json", "mmlu", "csqa/dev_rand_split.jsonl",
                   "csqa/train_rand_split.jsonl"]
MICRO_BATCH, BATCH = 2, 32  # the planner halves full SFT's micro-batch to 2 on one 139 GiB GPU; the config's batch
SIZES = ["--data.n", "64", "--no-data.keep-correct", "--knockout.seeds", "3", "--knockout.limit", "64",
         "--knockout.transfer-n", "32", "--attention.limit", "64", "--mlp.limit", "64", "--finetune.max-steps", "1",
         "--finetune.micro-batch-size", str(MICRO_BATCH), "--eval.limit", "4", "--eval.max-new-tokens", "64",
         "--batch-size", str(BATCH)]
# A phase: (name, variants, stages it may run (None: all), extra flags, seconds expected on an H100/H200, whether
# the config's also_identify sets are kept: a --stages "identify" would select them too, so C's config drops them).
# A and B were measured 2026-11-26 (RESULTS). C is table 2's head counts and full SFT's evaluation row, in two
# steps so that full SFT's row is evaluated even if the head counts run out of time: C1 trains full SFT and
# evaluates base, knockout and full; C2 adds precise@8..64 (the eval cache keeps C1's rows). Both evaluate
# EVAL_ITEMS items a benchmark (one batch of 32), so the eval stage's time per batch extrapolates to the full
# sets (C2-train: C2 without its evaluation). D runs the also_identify sets, measured nowhere yet. A random
# model never stops early, so every generation runs to --eval.max-new-tokens: the eval times are upper bounds
# at that cap.
EVAL_ITEMS = 32
C_STAGES = ["--stages", "data,identify,finetune,eval,report"]
C_EVAL = ["--eval.limit", str(EVAL_ITEMS)]
PHASES = [
    ("A", "precise@32,lora,random@32,precise@32+mlp3", None, [], 240, True),
    ("B", "precise@32,lora,random@32,precise@32+mlp3,full", None, [], 90, True),
    ("C1", "full", C_STAGES, C_EVAL, 150, False),
    ("C2", "full,precise@8,precise@16,precise@48,precise@64", C_STAGES, C_EVAL, 200, False),
    # C2's training alone, for a lease too short for C2's evaluation (2026-11-27)
    ("C2-train", "precise@8,precise@16,precise@48,precise@64", ["--stages", "data,identify,finetune"], [], 150, False),
    ("D", "full,precise@8,precise@16,precise@48,precise@64", ["--stages", "identify"], C_EVAL, 60, True),
    # C2's two outer head counts trained again and evaluated, for a 15-minute lease on one H100 (2026-11-27 evening):
    # the inner two would take what these take. K: the knockout, attention and MLP stages on today's code.
    ("C2-eval", "precise@8,precise@64", C_STAGES, C_EVAL, 300, False),
    ("K", "precise@32", ["--stages", "data,identify,knockout,attention,mlp"], [], 60, False),
]


def default_data_dir() -> Path:
    """$KEYHEADS_DATA, else the shared benchmark folder beside the checkout."""
    env = os.environ.get("KEYHEADS_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data" / "benchmarks"


def prepare() -> None:
    """Everything the GPU machine lacks, into .gpu/ (git-ignored; carry it)."""
    shutil.rmtree(PREPARED, ignore_errors=True)
    (PREPARED / "tokenizer").mkdir(parents=True)
    cache = Path(os.environ.get("KEYHEADS_CACHE", Path.home() / ".cache" / "keyheads")) / "models" / "smollm2-135m"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (cache / name).is_file():
            shutil.copy(cache / name, PREPARED / "tokenizer" / name)
    data = default_data_dir()
    for rel in BENCHMARK_FILES:
        src, dst = data / rel, PREPARED / "benchmarks" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    subprocess.run(["bash", str(ROOT / "bench" / "gpu_wheels.sh")], check=True)
    shutil.move(ROOT / ".whl", PREPARED / "whl")
    print(subprocess.run(["du", "-sh", str(PREPARED)], capture_output=True, text=True).stdout.strip())


def build_model(shape: str, folder: Path, device: str) -> dict:
    """A random model of `shape` with the prepared tokenizer, saved as bf16 safetensors -> what was used."""
    import torch
    import transformers
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(PREPARED / "tokenizer")
    config = LlamaConfig(**SHAPES[shape], vocab_size=len(tok), max_position_embeddings=4096,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, dtype="bfloat16")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(folder, max_shard_size="5GB")
    tok.save_pretrained(folder)
    used = {"build_seconds": round(time.perf_counter() - start, 1), "torch": torch.__version__,
            "transformers": transformers.__version__, "params": sum(p.numel() for p in model.parameters())}
    if torch.cuda.is_available():
        used.update(gpu=torch.cuda.get_device_name(0), gpu_bytes=torch.cuda.get_device_properties(0).total_memory)
    return used


class PeakSampler(threading.Thread):
    """The GPU's memory in use (NVML: what nvidia-smi shows, CUDA context and allocator reserve included),
    sampled every 50 ms; `window()` -> the peak since the last call."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.handle = 0, None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle, self.nvml = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml
        except Exception:  # noqa: BLE001 - no NVML (a CPU check): no device figure
            pass

    def run(self) -> None:
        while self.handle is not None:
            self.peak = max(self.peak, self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
            time.sleep(0.05)

    def window(self) -> int | None:
        peak, self.peak = self.peak, 0
        return peak if self.handle is not None else None


def worker(out: Path, phase: str, args: list[str]) -> int:
    """One `keyheads run` in this process, every stage's time and peak memory appended to out/stages.jsonl."""
    import torch

    from keyheads import cli
    from keyheads.stages import Runner

    sampler = PeakSampler()
    sampler.start()
    cuda = torch.cuda.is_available()
    plain = Runner.__call__

    def measured(self, stage) -> bool:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        sampler.window()
        start = time.perf_counter()
        ran = plain(self, stage)
        if ran:
            if cuda:
                torch.cuda.synchronize()
            row = {"phase": phase, "stage": stage.name, "seconds": round(time.perf_counter() - start, 2),
                   "allocated_peak": torch.cuda.max_memory_allocated() if cuda else None,
                   "reserved_peak": torch.cuda.max_memory_reserved() if cuda else None,
                   "device_peak": sampler.window()}
            with open(out / "stages.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
        return ran

    Runner.__call__ = measured
    return cli.main(args)


def run(out: Path, shape: str, device: str, budget: float, phases: list[str] | None = None) -> None:
    deadline = time.monotonic() + budget
    out.mkdir(parents=True, exist_ok=True)
    model = Path("/tmp/paper-gpu-model")
    shutil.rmtree(model, ignore_errors=True)
    shutil.rmtree("/tmp/paper-gpu-run", ignore_errors=True)  # phases of one call share it; calls do not
    # built in a process of its own, so that this one holds no CUDA context or cached blocks beside the stages
    built = subprocess.run([sys.executable, __file__, "build", str(model), shape, device], capture_output=True,
                           text=True)
    if built.returncode != 0:
        raise SystemExit(f"building the model failed:\n{built.stderr[-4000:]}")
    meta = {"shape": shape, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **json.loads(built.stdout.splitlines()[-1]), "sizes": SIZES, "phases": {}}
    gib = (meta.get("gpu_bytes") or 80 * 2**30) / 2**30
    kh = [sys.executable, "-m", "keyheads"]
    plan = subprocess.run([*kh, "plan", "--model", str(model), "--gpus", "1", "--gpu-memory", f"{gib:.1f}GiB",
                           "--micro-batch-size", str(MICRO_BATCH), "--batch-size", str(BATCH), "--json"],
                          capture_output=True, text=True)
    (out / "plan.json").write_text(plan.stdout or plan.stderr)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    chosen = [p for p in PHASES if phases is None or p[0] in phases]
    no_also = Path("/tmp/paper-gpu-config.yaml")  # the config without its also_identify sets
    no_also.write_text("".join(line for line in CONFIG.read_text().splitlines(keepends=True)
                               if not line.startswith("also_identify:")))
    for phase, variants, stages, extra, expected, also in chosen:
        left = deadline - time.monotonic()
        if left < expected:
            meta["phases"][phase] = f"not started: {left:.0f} s left, {expected} s expected"
            print(f"phase {phase}: {meta['phases'][phase]}", flush=True)
            continue
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
               str(Path(__file__).resolve()), "worker", str(out), phase, "--",
               "run", str(CONFIG if also else no_also), "--model", str(model), "--out", "/tmp/paper-gpu-run",
               "--data-dir", str(PREPARED / "benchmarks"), "--device", device, "--dtype", "bfloat16",
               "--variants", variants, *SIZES, *extra, *(stages or []),
               *(["--threads", "2"] if device == "cpu" else [])]
        start = time.monotonic()
        print(f"phase {phase}: {variants}", flush=True)
        try:
            rc = subprocess.run(cmd, timeout=max(deadline - time.monotonic(), 1)).returncode
        except subprocess.TimeoutExpired:
            rc = "timed out"
        meta["phases"][phase] = {"variants": variants, "seconds": round(time.monotonic() - start, 1), "rc": rc}
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
        if rc != 0:
            break
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    for name in ("config.json",):
        if (Path("/tmp/paper-gpu-run") / name).is_file():
            shutil.copy(Path("/tmp/paper-gpu-run") / name, out / f"run-{name}")
    # the run folder's small outputs (stage records, key heads, eval summaries and per-item results), no weights
    subprocess.run(["tar", "czf", str(out / "run-folder.tar.gz"), "--exclude=*.safetensors", "--exclude=*.pt",
                    "--exclude=*.bin", "--exclude=*.distcp", "--exclude=checkpoint*", "-C", "/tmp", "paper-gpu-run"])


PLAN_ROW = {  # stage (or its prefix) -> the planner's entry
    "identify": "patch", "knockout": "knockout", "attention": "attention", "mlp": "mlp", "eval": "eval/generate",
    "finetune/full": "finetune full", "finetune/lora": "finetune lora",
    "finetune/precise@32+mlp3": "finetune precise+mlp", "finetune/": "finetune precise",
}


def planned_option(plan: dict, stage: str) -> dict | None:
    """The planner's option for `stage` in the mode the run uses (FSDP2 training, analyses on one GPU)."""
    key = next((v for k, v in PLAN_ROW.items() if stage == k or (k.endswith("/") and stage.startswith(k))), None)
    mode = "fsdp" if key and key.startswith("finetune") else "gpu"
    return next((o for row in plan.get("stages", []) if row["stage"] == key for o in row["options"]
                 if o["mode"] == mode), None)


def planned_bytes(plan: dict, stage: str) -> int | None:
    option = planned_option(plan, stage)
    return option["memory"]["gpu"] if option else None


def planned(plan: dict, stage: str) -> str:
    option = planned_option(plan, stage)
    if option is None:
        return "-"
    fits = "" if option["fits"] else ", does not fit"
    return f"{option['memory']['gpu'] / 2**30:.1f} ({option['mode']}, batch {option.get('micro_batch', '?')}{fits})"


def replanned(plan: dict) -> dict:
    """The plan the planner of this checkout makes for the recorded shape, machine and workload."""
    from keyheads.commands.plan import to_json
    from keyheads.planning.planner import Machine, Workload, make_plan
    from keyheads.planning.shape import ModelShape

    if "shape" not in plan:
        return {}
    return to_json(make_plan(ModelShape(**plan["shape"]), Machine(**plan["machine"]), Workload(**plan["workload"])))


def report(folder: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "src"))
    from results import write_section

    meta = json.loads((folder / "meta.json").read_text())
    rows = [json.loads(line) for line in (folder / "stages.jsonl").read_text().splitlines() if line.strip()]
    try:
        plan = json.loads((folder / "plan.json").read_text())
    except ValueError:
        plan = {}
    today = replanned(plan)
    gib = lambda b: "-" if b is None else f"{b / 2**30:.1f}"  # noqa: E731
    table = ["| phase | stage | seconds | peak allocated GiB | peak reserved GiB | device peak GiB (NVML) "
             "| planner GiB/GPU then | planner today |", "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    table += [f"| {r['phase']} | {r['stage']} | {r['seconds']:.1f} | {gib(r['allocated_peak'])} | "
              f"{gib(r['reserved_peak'])} | {gib(r['device_peak'])} | {planned(plan, r['stage'])} | "
              f"{planned(today, r['stage'])} |" for r in rows]
    phases = "\n".join(f"- phase {k}: " + (v if isinstance(v, str) else
                        f"variants {v['variants']}; {v['seconds']:.0f} s; " + ("finished" if v["rc"] == 0 else
                        "stopped at the time limit" if v["rc"] == "timed out" else f"failed (exit {v['rc']})"))
                        for k, v in meta["phases"].items())
    ran = {r["stage"] for r in rows}
    not_run = [f"phase {k}" for k, *_ in PHASES if k not in meta["phases"]]
    over = [f"{r['stage']} {(r['allocated_peak'] - b) / 2**30:+.1f} GiB ({r['allocated_peak'] / b - 1:+.0%})"
            for r in rows if (b := planned_bytes(plan, r["stage"])) and r["allocated_peak"] and r["allocated_peak"] > b]
    over_today = [r["stage"] for r in rows if (b := planned_bytes(today, r["stage"])) and r["allocated_peak"]
                  and r["allocated_peak"] > b]
    reading = (f"Stages that ran: {len(ran)}. " + (f"Not started ({', '.join(not_run)}): the device time ran out. "
               if not_run else "") + "Torch's allocated peak above the planner's bytes when the run was made: "
               + ("; ".join(over) if over else "none") + "; above today's planner (this checkout, same shape, "
               "machine and workload): " + (", ".join(over_today) if over_today else "none") + ".")
    body = f"""Measured {meta['started'][:10]} on one {meta.get('gpu', '?')} (torch {meta.get('torch', '?')},
transformers
{meta.get('transformers', '?')}): `configs/paper-llama2-7b.yaml` under torchrun (one process, FSDP2 as the config says),
on a randomly initialised LLaMA-2-7B shape in bf16 with SmolLM2's tokenizer (vocabulary 49,152 instead of 32,000),
built and saved as safetensors on the GPU machine in {meta['build_seconds']} s. Sizes cut by flags, every other setting
the config's: `{' '.join(meta['sizes'])}`. Peak allocated/reserved are torch's counters reset at each stage's
start; the device peak is NVML's memory in use (CUDA context and the allocator's cache of earlier stages included).
The planner's column is `keyheads plan --gpus 1 --micro-batch-size {MICRO_BATCH} --batch-size {BATCH}` for the
GPU's memory, in the mode the run used (training: FSDP2; analyses: the model on the one GPU); its analysis figures
assume prompts of 256 tokens, its training figures samples of 512.

{phases}

{reading}

{chr(10).join(table)}

Command: `python bench/paper_gpu.py prepare` here, then on the GPU machine (carrying `.gpu`)
`python bench/paper_gpu.py run --out DIR`, then `python bench/paper_gpu.py report DIR`."""
    write_section("The paper config end to end on one GPU (bench/paper_gpu.py)", body)
    print("\n".join(table))


RECORDS = ROOT / "records" / "paper-llama2-7b-gpu"
PHASE_C_TITLE = "The paper config's phase C and also_identify sets on one GPU (bench/paper_gpu.py)"
README = ROOT / "README.md"
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
# README's cost paragraph lies between these markers, written from the records (tests/test_gpu_cost_figures.py)
README_BEGIN = ("<!-- gpu cost: written by `python bench/paper_gpu.py report-records` from records/paper-llama2-7b-gpu "
                "-->")
README_END = "<!-- end of gpu cost -->"
LLAMA2_VOCAB = 32_000  # LLaMA-2's tokenizer; the records' model has SmolLM2's (see the module's docstring)
PLAN_GPUS = 8  # README's `keyheads plan --model PATH --gpus 8`: the config's one node of 8 GPUs


def shown(path: Path) -> str:
    """`path` as the pages name it: from the repository's root when it is inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Record:
    """One committed record: meta.json (the machine), record.json (commit and command), plan.json, stages.jsonl
    (every stage's time and memory) and the run folder's small outputs (run/)."""

    folder: Path
    meta: dict
    record: dict
    plan: dict
    rows: tuple[dict, ...]

    @classmethod
    def read(cls, folder: Path) -> Record:
        try:
            plan = json.loads((folder / "plan.json").read_text())
        except (OSError, ValueError):
            plan = {}
        rows = tuple(json.loads(x) for x in (folder / "stages.jsonl").read_text().splitlines() if x.strip())
        return cls(folder, json.loads((folder / "meta.json").read_text()),
                   json.loads((folder / "record.json").read_text()), plan, rows)

    @property
    def gpu(self) -> str:
        return self.meta.get("gpu", "?")

    @property
    def commit(self) -> str:
        return self.record["commit"][:7]

    @property
    def run(self) -> Path:
        return self.folder / "run"


@dataclass(frozen=True)
class Trained:
    """One variant's fine-tuning in a record: run/finetune/VARIANT/finetune.json and its stage's row."""

    record: str
    gpu: str
    variant: str
    parallel: str               # the mode it trained in (fsdp: FSDP2)
    steps: int                  # the optimizer steps timed
    samples: int                # the samples those steps held
    samples_per_second: float
    first: bool                 # the first variant its run trained: its step carries the run's warm-up
    allocated_peak: int | None  # torch's peak during the stage (stages.jsonl)
    micro_batch: int
    run_samples: float          # what the config trains: the training set's samples times the epochs
    data_n: int
    epochs: float

    @property
    def minutes(self) -> float:
        """The config's whole training at this speed, on the record's one GPU."""
        return self.run_samples / self.samples_per_second / 60


@dataclass(frozen=True)
class BenchmarkCost:
    """One benchmark of the evaluation, extrapolated from the rows timed on one GPU model to its whole set."""

    benchmark: str
    full: int               # items in the whole evaluated set
    rows: int               # rows timed
    items: int              # items a row
    seconds: float          # a row's time for its items (the mean over the rows)
    cap: int | None         # new tokens measured (None: choices scored, no generation)
    at_cap: float           # seconds for the whole set and every row of the table, at the cap measured
    at_config: float        # the same with the generation scaled linearly to the config's cap


@dataclass(frozen=True)
class EvalCost:
    gpu: str
    rows: int  # the table's rows: base, knockout and each of the config's variants
    benchmarks: tuple[BenchmarkCost, ...]

    @property
    def hours_at_cap(self) -> float:
        return sum(b.at_cap for b in self.benchmarks) / 3600

    @property
    def hours_at_config(self) -> float:
        return sum(b.at_config for b in self.benchmarks) / 3600

    @property
    def items(self) -> int:
        return sum(b.full for b in self.benchmarks)


@dataclass(frozen=True)
class Figures:
    """Every figure README's cost paragraph and RESULTS' phase C section state, from the records (and, for the
    memory of the config's 8 GPUs, which no record measured, from the planner as `keyheads plan` calls it)."""

    records: tuple[Record, ...]
    variants: tuple[str, ...]       # the config's
    parallel: str                   # the config's training mode
    trained: tuple[Trained, ...]
    evaluated: dict[str, tuple[str, ...]]  # record folder -> the evaluation rows it holds
    evals: tuple[EvalCost, ...]     # one per GPU model
    plan: Plan                      # the planner's, for the config's model and machine
    plan_command: str

    @property
    def unevaluated(self) -> list[str]:
        done = {row for rows in self.evaluated.values() for row in rows}
        return [v for v in self.variants if v not in done]

    @property
    def untrained(self) -> list[str]:
        done = {t.variant for t in self.trained if t.parallel == self.parallel}
        return [v for v in self.variants if v not in done]


def eval_timings(run_folder: Path) -> dict[str, dict[str, tuple[int, float, int | None]]]:
    """row folder -> benchmark -> (items computed, seconds, max_new_tokens or None), from the eval stage's
    per-benchmark summaries (read as their type)."""
    from keyheads.results.evaluation import BenchmarkSummary
    from keyheads.runfolder import read_result

    out: dict[str, dict[str, tuple[int, float, int | None]]] = {}
    for path in sorted((run_folder / "eval").glob("*/*.json")):
        if path.name == "summary.json":  # the row's summaries together
            continue
        summary = read_result(path, BenchmarkSummary.from_json)
        if summary is not None and summary.timing:
            t = summary.timing
            out.setdefault(path.parent.name, {})[path.stem] = (int(t["computed"]), t["seconds"], summary.max_new_tokens)
    return out


@functools.cache
def full_size(benchmark: str, data_dir: Path) -> int:
    """Items in the benchmark's whole evaluated set; an MMLU category (mmlu-humanities, ...) is MMLU's questions
    of its subjects."""
    from keyheads.data.benchmarks import load
    from keyheads.evaluation.mmlu_subjects import CATEGORIES, subjects_of

    if benchmark in CATEGORIES:
        subjects = subjects_of(benchmark)
        return sum(r.subject in subjects for r in load("mmlu", data_dir=data_dir))
    return len(load(benchmark, data_dir=data_dir))


def trained(rec: Record) -> list[Trained]:
    """The fine-tuning runs a record holds, each with its speed and its stage's row."""
    from keyheads.runfolder import RunFolder

    rows = {r["stage"]: r for r in rec.rows}  # a stage's last row: the one whose outputs the run folder holds
    first: dict[str, str] = {}  # phase -> the first fine-tuning stage its run ran
    for r in rec.rows:
        if r["stage"].startswith("finetune/"):
            first.setdefault(r["phase"], r["stage"])
    out = []
    for variant, info in RunFolder(rec.run).finetune_records.items():
        row = rows.get(f"finetune/{variant}")
        t, epochs = info.train, float(info.config["epochs"])
        out.append(Trained(rec.folder.name, rec.gpu, variant, t.parallel, t.steps_this_run, t.samples_this_run,
                           t.samples_per_second, row is not None and first.get(row["phase"]) == row["stage"],
                           row["allocated_peak"] if row else None, int(info.config["micro_batch_size"]),
                           info.data.n * epochs, info.data.n, epochs))
    return out


def row_name(row) -> str:
    """An evaluation row as the config names it: base, knockout, or the variant whose adapter it evaluated."""
    spec = row.info.variant
    if spec is None:
        return row.label
    return Path(spec.model).name if spec.kind == "adapter" else "base" if spec.kind == "model" else spec.kind


def evaluated_rows(run: Path) -> tuple[str, ...]:
    from keyheads.runfolder import RunFolder

    results = RunFolder(run).eval_record
    return tuple(row_name(v) for v in results.variants) if results is not None else ()


def eval_costs(records: tuple[Record, ...], data_dir: Path, n_rows: int) -> tuple[EvalCost, ...]:
    """The evaluation: seconds an item at the measured cap, times the full sets, for the table's rows; one
    EvalCost per GPU model, since an H100's times are not an H200's."""
    from keyheads.evaluation.settings import DEFAULT_NEW_TOKENS

    timed: dict[str, dict[str, dict]] = {}
    for rec in records:
        timed.setdefault(rec.gpu, {}).update(
            {f"{rec.folder.name}/{row}": b for row, b in eval_timings(rec.run).items()})
    out = []
    for gpu, by_row in timed.items():
        costs = []
        for b in sorted({b for rows in by_row.values() for b in rows}):
            cells = [rows[b] for rows in by_row.values() if b in rows]
            items, cap = cells[0][0], cells[0][2]
            per_item = sum(c[1] for c in cells) / len(cells) / items
            full = full_size(b, data_dir)
            at_cap = per_item * full * n_rows
            scale = (DEFAULT_NEW_TOKENS.get(b, cap) / cap) if cap else 1.0
            costs.append(BenchmarkCost(b, full, len(cells), items, per_item * items, cap, at_cap, at_cap * scale))
        if costs:
            out.append(EvalCost(gpu, n_rows, tuple(costs)))
    return tuple(out)


def planned_memory(micro_batch: int) -> tuple[Plan, str]:
    """`keyheads plan --model PATH --gpus 8` on LLaMA-2-7B's config (its own vocabulary, not the records'), with
    the config's micro-batch: the plan and the command that gives it."""
    import tempfile

    import transformers

    from keyheads.commands.plan import plan_from
    from keyheads.config.commands import PlanCommand

    command = f"keyheads plan --model PATH --gpus {PLAN_GPUS}"
    if micro_batch != PlanCommand.model_fields["micro_batch_size"].default:
        command += f" --micro-batch-size {micro_batch}"
    with tempfile.TemporaryDirectory() as tmp:
        config = transformers.LlamaConfig(**SHAPES["llama-2-7b"], vocab_size=LLAMA2_VOCAB)
        config.to_json_file(Path(tmp) / "config.json")
        return plan_from(PlanCommand(model=tmp, gpus=PLAN_GPUS, micro_batch_size=micro_batch)), command


def gather(folders: list[Path], data_dir: Path, config: Path = CONFIG) -> Figures:
    """The figures of the records in `folders`, for the config they ran."""
    from keyheads.config.run import RunSettings

    settings = RunSettings.from_yaml(config, data_dir=str(data_dir))
    records = tuple(Record.read(f) for f in folders)
    n_rows = 2 + len(settings.variants)  # table 1: base, knockout, and the config's variants
    plan, command = planned_memory(settings.finetune.micro_batch_size)
    return Figures(records, tuple(settings.variants), settings.finetune.parallel,
                   tuple(t for rec in records for t in trained(rec)),
                   {rec.folder.name: evaluated_rows(rec.run) for rec in records},
                   eval_costs(records, data_dir, n_rows), plan, command)


def record_folders(root: Path | None = None) -> list[Path]:
    return sorted(p for p in (root or RECORDS).iterdir() if (p / "record.json").is_file())


def report_records(folders: list[Path], data_dir: Path) -> str:
    """The RESULTS section of phase C from committed records (each a folder with meta.json, stages.jsonl,
    record.json and run/): stage times and memory, and the evaluation's time extrapolated to the full sets."""
    return results_body(gather(folders, data_dir))


def results_body(fig: Figures) -> str:
    from keyheads.evaluation.settings import DEFAULT_NEW_TOKENS

    gib = lambda b: "-" if b is None else f"{b / 2**30:.1f}"  # noqa: E731
    lines = []
    table = ["| record | phase | stage | seconds | peak allocated GiB | peak reserved GiB | device peak GiB (NVML) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for rec in fig.records:
        meta, record = rec.meta, rec.record
        table += [f"| {rec.folder.name} | {r['phase']} | {r['stage']} | {r['seconds']:.1f} | "
                  f"{gib(r['allocated_peak'])} | {gib(r['reserved_peak'])} | {gib(r['device_peak'])} |"
                  for r in rec.rows]
        phases = "; ".join(f"{k}: " + (v if isinstance(v, str) else f"{v['seconds']:.0f} s, " + (
            "finished" if v["rc"] == 0 else "cut at the time limit" if v["rc"] == "timed out" else f"exit {v['rc']}"))
            for k, v in meta["phases"].items())
        lines.append(f"- `{shown(rec.folder)}`: {rec.gpu}, torch {meta.get('torch', '?')}, "
                     f"transformers {meta.get('transformers', '?')}, commit {rec.commit}; model built in "
                     f"{meta['build_seconds']} s; phases {phases}. Command: `{record['command']}`")
    ext: list[str] = []
    for e in fig.evals:
        ext += [*([""] if ext else []), f"On the {e.gpu}:", "",
                "| benchmark | full set | rows timed | items a row | s a row (mean) | cap (tokens) "
                f"| full set, {e.rows} rows, at the cap measured | at the config's cap (x tokens) |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        ext += [f"| {c.benchmark} | {c.full:,} | {c.rows} | {c.items} | {c.seconds:.1f} | {c.cap or '-'} | "
                f"{c.at_cap / 3600:.2f} h | {c.at_config / 3600:.2f} h |" for c in e.benchmarks]
        ext.append(f"| all | | | | | | {e.hours_at_cap:.1f} h | {e.hours_at_config:.1f} h |")
    benches = {c.benchmark for e in fig.evals for c in e.benchmarks}
    return f"""Measured 2026-11-27, each record on one GPU (named in its line), on a randomly initialised
LLaMA-2-7B shape in bf16 (SmolLM2's tokenizer, as in "The paper config end to end on one GPU"),
`configs/paper-llama2-7b.yaml` under torchrun (one process, FSDP2). The records are committed: each folder
holds the run's meta, the planner's plan, every stage's time and memory (stages.jsonl) and the run folder's
small outputs (stage records, pairs, effects, key heads, the fine-tuning summaries with their loss, the
evaluation's per-benchmark summaries and per-item cache), without weights. Sizes cut by flags as in the
earlier section; phases C1, C2 and C2-eval evaluate {EVAL_ITEMS} items a benchmark (one batch of 32) instead
of 4, and run without the also_identify sets (phase D runs them).

{chr(10).join(lines)}

What ran: phase C1 (full SFT, then the evaluation of base, knockout and full SFT), phase D (the six
also_identify sets: every identify/NAME stage finished; the phase was cut while its run went on to the
stale later stages, which it does not select), phase C2's training (precise@8, @16, @48, @64) on the H200;
then on an H100, phase C2-eval (precise@8 and @64 trained again and evaluated beside base and knockout, MMLU's
humanities subset included) and phase K (the knockout, attention and MLP stages on the library code of
fa1e9bb). Not measured: the evaluation rows of precise@16 and @48 (the lease ended; each would take what the
other precise rows took) and the evaluation on an H200 of anything but C1's rows.

{chr(10).join(table)}

The evaluation stage, extrapolated to the config's whole sets. Per item: the mean over the rows timed of each
benchmark's own time (loading excluded) over its {EVAL_ITEMS} items, in one batch of 32. A random model never
emits its stop token, so every generated answer ran to the cap measured (64 new tokens); a real model stops
earlier, so these are upper bounds at that cap. The last column scales the generation sets linearly to the
config's caps ({', '.join(f'{k} {v}' for k, v in DEFAULT_NEW_TOKENS.items() if k in benches)} new tokens):
an estimate, not a measurement. MMLU and CSQA score choices, with no generation. The eval stage's own time
(stages.jsonl) is larger than the benchmarks' sum: it also loads each row's model (13 GB for full SFT).

{chr(10).join(ext)}

Command: `python bench/paper_gpu.py report-records` (here, from the committed records)."""


def short_gpu(name: str) -> str:
    """NVIDIA H100 80GB HBM3 -> H100."""
    words = name.removeprefix("NVIDIA ").split()
    return words[0] if words else name


def joined(items: list[str]) -> str:
    """a, b and c."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s")


def span(values: list[float]) -> str:
    """The range of `values` rounded to whole numbers: 20-24, or 25 when both ends round alike."""
    lo, hi = f"{min(values):.0f}", f"{max(values):.0f}"
    return lo if lo == hi else f"{lo}-{hi}"


MODE_NAMES = {"fsdp": "FSDP2", "ddp": "DDP"}


def gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


def memory_sentence(fig: Figures) -> str:
    """The planner's bytes a GPU for the config on its 8 GPUs: training in the config's mode, analyses on one GPU."""
    plan, w, m = fig.plan, fig.plan.workload, fig.plan.machine
    names = {"finetune precise": f"precise SFT ({w.heads} heads)", "finetune precise+mlp": f"precise SFT + {w.mlps} "
             "MLPs", "finetune lora": f"LoRA (rank {w.lora_rank})", "finetune full": "full SFT"}
    modes = {s.stage: {o.mode: o for o in s.options} for s in plan.stages}
    training = [(names[s], o[fig.parallel]) for s, o in modes.items() if s.startswith("finetune")]
    analyses = [(s, o["gpu"]) for s, o in modes.items() if not s.startswith("finetune")]
    misfits = [name for name, o in training + analyses if not o.fits]
    sizes = ", ".join(f"{name} {gib(o.memory.gpu)}" + (" GiB a GPU" if i == 0 else "")
                      for i, (name, o) in enumerate(training))
    ddp = [f"{names[s]} would need {gib(o['ddp'].memory.gpu)}" for s, o in modes.items()
           if "ddp" in o and not o["ddp"].fits and fig.parallel != "ddp"]
    fits = "every stage fits" if not misfits else f"not every stage fits ({joined(misfits)} does not)"
    low, high = min(o.memory.gpu for _, o in analyses), max(o.memory.gpu for _, o in analyses)
    return (f"Memory, as `{fig.plan_command}` estimates it ({w.seq_len} tokens a sample, micro-batch {w.micro_batch}): "
            f"{fits} one {m.gpu_bytes / 2**30:.0f} GiB GPU in the config's mode, training under "
            f"{MODE_NAMES.get(fig.parallel, fig.parallel)} over the {m.world} GPUs ({sizes}"
            + (f"; under DDP {joined(ddp)}" if ddp else "")
            + f") and each analysis on one GPU ({gib(low)}-{gib(high)} GiB).")


def training_sentences(fig: Figures) -> list[str]:
    """What the records measured of training in the config's mode: full SFT's peak on one GPU, each variant's
    speed, and the config's whole training at that speed."""
    vocab = sorted({rec.plan.get("shape", {}).get("vocab") for rec in fig.records} - {None})
    mode = MODE_NAMES.get(fig.parallel, fig.parallel)
    ts = [t for t in fig.trained if t.parallel == fig.parallel]
    peaks = [f"on one {short_gpu(t.gpu)} full SFT allocated {gib(t.allocated_peak)} GiB at its peak (micro-batch "
             f"{t.micro_batch})" for t in ts if t.variant == "full" and t.allocated_peak]
    out = ["Measured at cut sizes with random weights of LLaMA-2-7B's shape"
           + (f" (vocabulary {joined([f'{v:,}' for v in vocab])}: SmolLM2's tokenizer)" if vocab else "")
           + f", one process under {mode} (`{shown(fig.records[0].folder.parent)}`)"
           + (": " + "; ".join(peaks) + "." if peaks else ".")]
    order = {v: i for i, v in enumerate(fig.variants)}
    by_gpu: dict[str, list[Trained]] = {}
    for t in sorted(ts, key=lambda t: order.get(t.variant, len(order))):
        by_gpu.setdefault(short_gpu(t.gpu), []).append(t)
    speeds: list[str] = []
    for gpu, g in by_gpu.items():
        cells: list[str] = []
        for t in g:
            unit = "" if speeds or cells else " samples/s"  # after the first figure only
            name = "full SFT" if t.variant == "full" else t.variant
            cells.append(f"{name} {t.samples_per_second:.1f}{unit}" + (" (first)" if t.first else ""))
        speeds.append(f"on the {gpu} " + ", ".join(cells))
    steps = joined([f"{'one' if n == 1 else n} optimizer step{'s' if n > 1 else ''} of {samples} samples"
                    for n, samples in sorted({(t.steps, t.samples) for t in ts})])
    if speeds:
        out.append(f"Training speed in the config's mode, from {steps}: " + "; ".join(speeds)
                   + " (first: the first variant its run trained, whose step carries the run's warm-up).")
    minutes = []
    for gpu, g in by_gpu.items():
        full = [t for t in g if t.variant == "full"]
        precise = [t.minutes for t in g if t.variant.startswith("precise") and not t.first]
        parts = []
        if full:
            first = " (first)" if all(t.first for t in full) else ""
            parts.append(f"{span([t.minutes for t in full])} minutes for full SFT{first}")
        if precise:
            parts.append(f"{span(precise)}{'' if full else ' minutes'} for each precise variant not marked first")
        minutes += [f"on the {gpu}, about " + " and ".join(parts)] if parts else []
    runs = {(t.run_samples, t.data_n, t.epochs) for t in ts}
    if len(runs) == 1 and minutes:
        [(total, n, epochs)] = runs
        out.append(f"For the config's {total:,.0f} samples ({n:,} x {epochs:g} epochs) that is, on one GPU: "
                   + "; ".join(minutes) + ".")
    if fig.untrained:
        out.append(f"Not trained on this config in this mode: {joined(fig.untrained)}.")
    return out


def evaluation_sentence(fig: Figures) -> str:
    """The evaluation's GPU-hours for the config's table on each GPU model, as RESULTS extrapolates them."""
    from keyheads.evaluation.settings import DISPLAY

    if not fig.evals:
        return ""
    first, parts = fig.evals[0], []
    for e in fig.evals:
        if e is first:
            caps = joined([str(c) for c in sorted({c.cap for c in e.benchmarks if c.cap})])
            parts.append(f"on the {short_gpu(e.gpu)}, {e.hours_at_cap:.1f} GPU-hours for {e.items:,} items at {caps} "
                         f"new tokens ({e.hours_at_config:.1f} at the config's caps)")
            continue
        known = {c.benchmark for c in first.benchmarks}
        added = [f"{possessive(DISPLAY.get(c.benchmark, c.benchmark))} {c.full:,} items" for c in e.benchmarks
                 if c.benchmark not in known]
        parts.append(f"on the {short_gpu(e.gpu)}" + (f", with {joined(added)} added" if added else "")
                     + f", {e.hours_at_cap:.1f} ({e.hours_at_config:.1f})")
    return (f"The evaluation of {first.rows} rows (base, knockout and each variant), extrapolated from {EVAL_ITEMS} "
            "items a benchmark: " + "; ".join(parts) + "; upper bounds, since a random model never stops before the "
            "cap (bench/RESULTS.md, \"The paper config's phase C ...\").")


def ran_sentences(fig: Figures) -> list[str]:
    """What ran on which GPU and commit (stages.jsonl, the evaluation rows), and the rows no record holds."""
    ran = []
    for gpu, commit in dict.fromkeys((rec.gpu, rec.commit) for rec in fig.records):
        recs = [rec for rec in fig.records if (rec.gpu, rec.commit) == (gpu, commit)]
        stages = list(dict.fromkeys(r["stage"] for rec in recs for r in rec.rows))
        also = [s for s in stages if s.startswith("identify/")]
        tuned = [s.removeprefix("finetune/") for s in stages if s.startswith("finetune/")]
        rows = list(dict.fromkeys(row for rec in recs for row in fig.evaluated.get(rec.folder.name, ())))
        what = [s for s in stages if not s.startswith(("identify/", "finetune/")) and s != "eval"]
        what += [f"the {len(also)} also_identify sets"] if also else []
        what += [f"the training of {joined(tuned)}"] if tuned else []
        what += [f"the evaluation rows of {joined(rows)}"] if rows else []
        ran.append(f"on the {short_gpu(gpu)} (commit {commit}): {joined(what)}")
    out = ["What ran on this config: " + "; ".join(ran) + "."]
    if fig.unevaluated:
        out.append(f"The evaluation rows of {joined(fig.unevaluated)} are unmeasured on this config.")
    return out


def readme_text(fig: Figures) -> str:
    """README's cost paragraph, every figure from `fig`."""
    parts = ["What it costs (LLaMA-2-7B, bf16).", memory_sentence(fig), *training_sentences(fig),
             evaluation_sentence(fig), *ran_sentences(fig)]
    return textwrap.fill(" ".join(p for p in parts if p), width=116, break_long_words=False, break_on_hyphens=False)


def readme_block(fig: Figures) -> str:
    return f"{README_BEGIN}\n{readme_text(fig)}\n{README_END}"


def written(text: str) -> str | None:
    """The cost block a page holds, markers included (None without one)."""
    start, end = text.find(README_BEGIN), text.find(README_END)
    return text[start:end + len(README_END)] if start >= 0 and end > start else None


def update_records(data_dir: Path, check: bool = False) -> int:
    """Write README's cost block and RESULTS' phase C section from the records (check: only compare; 1 when
    either differs)."""
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "src"))
    from results import read_section, write_section

    from keyheads.io import atomic_write_text

    fig = gather(record_folders(), data_dir)
    body, block = results_body(fig), readme_block(fig)
    text = README.read_text()
    have = written(text)
    if have is None:
        print(f"{shown(README)}: no gpu cost markers ({README_BEGIN!r} ... {README_END!r})", file=sys.stderr)
        return 1
    stale = [page for page, ok in ((RESULTS_MD, read_section(PHASE_C_TITLE, RESULTS_MD) == body.strip()),
                                   (README, have == block)) if not ok]
    if not check:
        write_section(PHASE_C_TITLE, body, RESULTS_MD)
        if have != block:
            atomic_write_text(README, text.replace(have, block))
        print(body + "\n\n" + block)
    for page in stale:
        print(f"{shown(page)}: " + ("differs from the records" if check else "rewritten"))
    return 1 if check and stale else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build"]:  # build FOLDER SHAPE DEVICE, in its own process
        print(json.dumps(build_model(argv[2], Path(argv[1]), argv[3])))
        return 0
    if argv[:1] == ["worker"]:  # under torchrun: worker OUT PHASE -- keyheads args
        out, phase, rest = Path(argv[1]), argv[2], argv[4:]
        sys.path.insert(0, str(ROOT / "src"))
        return worker(out, phase, rest)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("prepare")
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--shape", choices=sorted(SHAPES), default="llama-2-7b")
    r.add_argument("--device", default="cuda")
    r.add_argument("--budget", type=float, default=480, help="seconds the phases may take in all")
    r.add_argument("--phases", help="comma-separated phases to run, in their order (default: all)")
    p = sub.add_parser("report")
    p.add_argument("folder", type=Path)
    rr = sub.add_parser("report-records", help="phase C's RESULTS section and README's cost paragraph from the "
                                               "committed records")
    rr.add_argument("--data-dir", type=Path, default=None,
                    help="the benchmark folder, for the whole sets' sizes (default: $KEYHEADS_DATA, else "
                         "../shared/data/benchmarks beside the checkout)")
    rr.add_argument("--check", action="store_true", help="only compare; exit 1 when README or RESULTS differs")
    a = ap.parse_args(argv)
    if a.what == "prepare":
        prepare()
    elif a.what == "run":
        run(a.out, a.shape, a.device, a.budget, a.phases.split(",") if a.phases else None)
    elif a.what == "report-records":
        return update_records(a.data_dir or default_data_dir(), a.check)
    else:
        report(a.folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
