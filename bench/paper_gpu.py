"""The paper config (configs/paper-llama2-7b.yaml) end to end on one GPU, on a randomly initialised model of
LLaMA-2-7B's shape in bf16: each stage's time and peak GPU memory, with `keyheads plan`'s estimate beside it.

No weights travel: the model is built on the GPU machine from its config (seed 0) and saved as safetensors,
so loading, FSDP2's sharded read and every stage run as they would on the real model. The tokenizer is
SmolLM2's (LLaMA-2's is not at hand offline), so the vocabulary is 49,152 rows instead of 32,000 (6.88B
parameters instead of 6.74B). A random model answers nothing correctly, so the data stage keeps every pair
(--no-data.keep-correct); only sizes are cut (flags in SIZES), every setting of the protocol is the config's.

    python -m bench.paper_gpu prepare              # here: tokenizer, benchmark files, wheels into .gpu/
    python -m bench.paper_gpu run --out DIR        # on the GPU machine (carry .gpu): writes DIR/*.json*
    python -m bench.paper_gpu report DIR           # here: the RESULTS section from DIR (--results FILE: into FILE)
    python -m bench.paper_gpu report-records       # here: README's cost paragraph and RESULTS' phase C section,
                                                   # from the committed records (--check: only compare)

`run` goes in phases, each a `keyheads run` of the same run folder under torchrun (one process, FSDP2 as the
config says): A every stage with table 1's adapters except full SFT, B full SFT added (the planner puts it
at the GPU's edge), C table 2's head counts added. A phase starts only if its estimate fits the time left,
and every stage's figures are appended to DIR/stages.jsonl as it ends, so a cut-off run keeps what finished.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.paper_gpu_setup import CONFIG, EVAL_ITEMS, SHAPES, default_data_dir
from bench.results import RESULTS, write_section

ROOT = Path(__file__).resolve().parents[1]
PREPARED = ROOT / ".gpu"
# the section `report DIR` writes lies between these: its figures are DIR's, not typed (tests/test_one_value.py)
RUN_BEGIN = ("<!-- gpu run: written by `python bench/paper_gpu.py report DIR` from the folder DIR of "
             "`python bench/paper_gpu.py run` -->")
RUN_END = "<!-- end of gpu run -->"
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
    built = subprocess.run([sys.executable, "-m", "bench.paper_gpu", "build", str(model), shape, device],
                           capture_output=True, text=True)
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
               "-m", "bench.paper_gpu", "worker", str(out), phase, "--",
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
    "identify": "identify", "knockout": "knockout", "attention": "attention", "mlp": "mlp", "eval": "eval/generate",
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


def report(folder: Path, results: Path = RESULTS) -> None:
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
    body = f"""{RUN_BEGIN}
Measured {meta['started'][:10]} on one {meta.get('gpu', '?')} (torch {meta.get('torch', '?')},
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

Command: `python -m bench.paper_gpu prepare` here, then on the GPU machine (carrying `.gpu`)
`python -m bench.paper_gpu run --out DIR`, then `python -m bench.paper_gpu report DIR`.
{RUN_END}"""
    write_section("The paper config end to end on one GPU (bench/paper_gpu.py)", body, results)
    print("\n".join(table))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build"]:  # build FOLDER SHAPE DEVICE, in its own process
        print(json.dumps(build_model(argv[2], Path(argv[1]), argv[3])))
        return 0
    if argv[:1] == ["worker"]:  # under torchrun: worker OUT PHASE -- keyheads args
        out, phase, rest = Path(argv[1]), argv[2], argv[4:]
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
    p.add_argument("--results", type=Path, default=RESULTS, help="the RESULTS file the section goes to")
    sub.add_parser("report-records", add_help=False,
                   help="README's cost paragraph and RESULTS' phase C section from the committed records "
                        "(bench/paper_gpu_records.py; its flags follow)")
    if argv[:1] == ["report-records"]:  # the records' report: its own module, with its own flags
        from bench.paper_gpu_records import main as report_records

        return report_records(argv[1:])
    a = ap.parse_args(argv)
    if a.what == "prepare":
        prepare()
    elif a.what == "run":
        run(a.out, a.shape, a.device, a.budget, a.phases.split(",") if a.phases else None)
    else:
        report(a.folder, a.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
