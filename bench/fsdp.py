"""Past one process: DDP against FSDP2 on 1 and 2 processes, a killed FSDP2 run resumed, and the GPU cases.

Every case is its own launch (torch.distributed.run for 2 processes), so each peak memory is its own.
On the CPU the processes share the machine's cores: 1 process gets 2 threads, 2 processes 1 each.

    python -m bench.fsdp cpu            # each method x {DDP, FSDP2} x {1, 2} processes, SmolLM2-135M
    python -m bench.fsdp resume         # full SFT of SmolLM2 on 2 FSDP2 processes, killed at step 3 and
                                        # resumed; the model/ it writes against one plain process
    python -m bench.fsdp gpu-offload    # full SFT of a random LLaMA-2-7B shape on one GPU, FSDP2 + offload
    python -m bench.fsdp gpu-overhead   # precise SFT on one GPU: FSDP2 (one process) against DDP
    python -m bench.fsdp gpu-split      # patching a model split between cuda:0 and cpu, against cuda:0
    python -m bench.fsdp cpu --tiny     # a check in seconds: a tiny random model, full SFT on 2 processes under
                                        # DDP and under FSDP2, 3 steps (resume --tiny: 3 steps, killed at step 2)

The GPU cases need no file from outside the repository: their models are randomly initialised in the
shapes of LLaMA-2-7B and of the bundled SmolLM2-135M, with a character tokenizer (bench/gpu_wheels.sh
fetches the Python packages such a machine may lack).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import tiny
from bench.results import machine, provenance, write_section
from keyheads.effects import Effects
from keyheads.results.finetune import FinetuneResult
from keyheads.runfolder import EFFECTS_JSON, FINETUNE_JSON, read_result

ROOT = Path(__file__).resolve().parents[1]
WORKER = "bench.fsdp_worker"  # run as a module, alone or under torch.distributed.run
KEYHEADS = [sys.executable, "-m", "keyheads.cli"]
MODEL = "smollm2-135m"
TRAIN = "arith:multidigit:96"
# 32 of SmolLM2's 270 heads and three MLPs, spread over the layers (the cost of precise SFT depends on how
# many slices and where, not on which heads: a fixed set keeps the cases comparable without effects.json).
HEADS = [[layer, head] for layer in range(6, 30, 3) for head in (0, 3, 6, 8)]
CASES = {"precise (32 heads)": ("precise", {"heads": HEADS, "mlps": [], "source": "bench"}),
         "precise + 3 MLPs": ("precise", {"heads": HEADS, "mlps": [20, 21, 22], "source": "bench"}),
         "LoRA r8": ("lora", None), "full": ("full", None)}
RECIPE = dict(max_steps=6, save_every=0, optimizer_batch_size=16, micro_batch_size=4, lr=1e-4)


@dataclass(frozen=True)
class Job:
    """What the CPU parts train: the model, the training set, the cases, the process counts and the recipe."""

    model: str = MODEL
    train: str = TRAIN
    cases: tuple[str, ...] = tuple(CASES)
    processes: tuple[int, ...] = (1, 2)
    recipe: dict = field(default_factory=lambda: dict(RECIPE))
    resume_steps: int = 4  # resume: the steps trained, and the step the last process dies in (after the
    kill_at: int = 3       # checkpoint of the step before)


def tiny_job() -> Job:
    """--tiny: full SFT of a tiny random model on 2 processes (the figures the text compares), 3 steps (the
    workers time the steps between the first and the last)."""
    return Job(model=str(tiny.model_folder()), train="arith:multidigit:8", cases=("full",), processes=(2,),
               recipe=dict(RECIPE, max_steps=3, optimizer_batch_size=4, micro_batch_size=2), resume_steps=3,
               kill_at=2)


def launch(spec: dict, folder: Path, processes: int, check: bool = True) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(json.dumps(spec))
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
           if processes > 1 else [sys.executable])
    env = {**os.environ, "PYTHONPATH": python_path(), "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(spec.get("threads", 1))}
    proc = subprocess.run(cmd + ["-m", WORKER, str(folder / "spec.json"), str(folder / "results")], env=env,
                          capture_output=True, text=True)
    if check and proc.returncode:
        raise SystemExit(f"{folder}: the launch failed\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


def finetuned(folder: Path) -> FinetuneResult:
    """The finetune.json of a finished run folder, read as its type."""
    info = read_result(folder / FINETUNE_JSON, FinetuneResult.from_json)
    if info is None:
        sys.exit(f"{folder / FINETUNE_JSON} was not written: the run did not finish")
    return info


def python_path() -> str:
    """src/ first, then whatever the caller had (packages unpacked beside the system's)."""
    return os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)


def ranks(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((folder / "results").glob("rank*.json"))]


def cpu(root: Path, job: Job) -> str:
    rows = ["| method | parallel | processes | peak RSS per process (MiB) | of which before training (MiB) | "
            "frozen weights per process (MiB) | trained weights + grads + optimizer state per process (MiB) | "
            "s/step (median) | final loss |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    seen: dict[tuple[str, str, int], tuple[float, float]] = {}
    finals: dict[str, list[float]] = {}
    for name in job.cases:
        method, components = CASES[name]
        for parallel in ("ddp", "fsdp"):
            for processes in job.processes:
                folder = root / f"{method}-{len(components['mlps']) if components else 0}-{parallel}-{processes}"
                config = {"method": method, "parallel": parallel, **job.recipe}
                launch({"model": job.model, "train": job.train, "config": config, "components": components,
                        "threads": 2 // processes, "out": str(folder / "out")}, folder, processes)
                got = ranks(folder)
                step = statistics.median(s for r in got for s in r["step_seconds"])
                peak, loaded = (max(r[k] for r in got) for k in ("peak_rss_mib", "loaded_rss_mib"))
                frozen, state = (max(r[k] for r in got) for k in ("frozen_mib_here", "trained_state_mib_here"))
                seen[name, parallel, processes] = (state, step)
                finals.setdefault(name, []).append(got[0]["losses"][-1])
                rows.append(f"| {name} | {parallel} | {processes} | {peak:,.0f} | {loaded:,.0f} | {frozen:,.0f} | "
                            f"{state:,.1f} | {step:.2f} | {got[0]['losses'][-1]:.4f} |")
                print(rows[-1], flush=True)
    full = {k[1:]: v for k, v in seen.items() if k[0] == "full"}
    r = job.recipe
    return "\n".join(rows) + f"""

SmolLM2-135M in fp32, {r['max_steps']} steps of {r['optimizer_batch_size']} samples in micro-batches of
{r['micro_batch_size']} ({job.train}); one process runs 2 threads, each of two processes 1. Peak RSS counts
the whole model each process loads before sharding it ("before training"), the Python and torch runtime,
and the logits over a 49k vocabulary; the two columns after it count tensors. Full SFT's trained state per
process: DDP {full['ddp', 2][0]:,.0f} MiB on each of 2 processes, FSDP2 {full['fsdp', 2][0]:,.0f} MiB
({full['fsdp', 2][0] / full['ddp', 2][0]:.2f}x). Step time on 2 processes, FSDP2 against DDP:
{full['fsdp', 2][1] / full['ddp', 2][1]:.2f}x for full SFT (every layer's weights are gathered over gloo in
the forward and again in the backward pass). Largest difference of a method's final loss across the
four set-ups: {max(max(v) - min(v) for v in finals.values()):.1e}.

The tensors halve on two FSDP2 processes; peak RSS does not, on a model this small: it also counts the
safetensors pages every process maps while loading (resident until the last tensor of the file is freed), the
copies made while sharding (about one model's worth, transient) and gloo's gather buffers. Measured apart
(precise SFT, 2 processes, RSS from /proc at the 4th micro-batch): 1.76 GB under FSDP2 against 1.33 GB under
DDP. A likely part, not verified: FSDP2 keeps the root group whole from the forward to the backward pass, and
here the root is the tied 49k x 576 embedding, 21% of SmolLM2's parameters (2% of a 7B model's). Sharding
pays where weights and optimizer state dominate, which is at 7B and up on GPUs (the planner's table above)."""


def resume(root: Path, job: Job) -> str:
    """Full SFT on two FSDP2 processes, killed after the checkpoint of the step before job.kill_at, resumed;
    against one process."""
    import torch
    from transformers import AutoModelForCausalLM

    kill, recipe = job.kill_at, dict(job.recipe, max_steps=job.resume_steps, save_every=job.kill_at - 1)
    config = {"method": "full", "parallel": "fsdp", **recipe}
    spec = {"model": job.model, "train": job.train, "config": config, "threads": 1, "out": str(root / "fsdp" / "out")}
    killed = launch({**spec, "crash_at": kill}, root / "fsdp", 2, check=False)
    assert killed.returncode != 0 and f"simulated kill at step {kill}" in killed.stderr + killed.stdout, \
        killed.stderr[-3000:]
    shards = sorted(p.name for p in (root / "fsdp" / "out" / "checkpoint" / "shards").iterdir())
    t0 = time.perf_counter()
    resumed = launch(spec, root / "fsdp", 2)
    resumed_seconds = time.perf_counter() - t0
    note = next((line for line in resumed.stderr.splitlines() if "resuming from" in line), "no resume note")
    single = {**spec, "config": {**config, "parallel": "ddp"}, "threads": 2, "out": str(root / "one" / "out")}
    launch(single, root / "one", 1)
    a = AutoModelForCausalLM.from_pretrained(root / "fsdp" / "out" / "model")
    b = AutoModelForCausalLM.from_pretrained(root / "one" / "out" / "model")
    base = AutoModelForCausalLM.from_pretrained(str(_model_folder(job.model)))
    pb, pbase = dict(b.named_parameters()), dict(base.named_parameters())
    worst = max((p - pb[n]).abs().max().item() for n, p in a.named_parameters())
    moved = max((p - pbase[n]).abs().max().item() for n, p in b.named_parameters())
    losses = [finetuned(root / d / "out").train.losses for d in ("fsdp", "one")]
    dtypes = sorted({str(p.dtype) for p in a.parameters()})
    return "\n".join([
        f"- Killed at step {kill} on two FSDP2 processes, after the checkpoint of step {kill - 1} "
        f"({', '.join(shards)}); the same command again: `{note.strip()}`, finished in {resumed_seconds:.0f} s.",
        f"- `model/` loads with plain `AutoModelForCausalLM.from_pretrained` ({', '.join(dtypes)}); largest "
        f"difference from one plain process trained without a kill: **{worst:.2e}** (the training moved weights "
        f"by up to {moved:.2e}).",
        f"- Losses, two FSDP2 processes with the kill: {', '.join(f'{x:.5f}' for x in losses[0])}; one process: "
        f"{', '.join(f'{x:.5f}' for x in losses[1])}.",
        f"- {torch.__version__}, full SFT, AdamW, batch {recipe['optimizer_batch_size']} in micro-batches of "
        f"{recipe['micro_batch_size']}, {recipe['max_steps']} steps."])


def _model_folder(model: str) -> Path:
    """The folder a model loads from: itself, or a bundled model's converted cache."""
    from keyheads.models.loading import ensure_converted

    return Path(model) if Path(model).is_dir() else ensure_converted(model)


def gpu_offload(root: Path) -> str:
    spec = {"random_init": "llama2-7b", "train": "arith:multidigit:64", "threads": 8, "out": str(root / "out"),
            "config": {"method": "full", "parallel": "fsdp", "offload": True, **dict(RECIPE, max_steps=4,
                                                                                       optimizer_batch_size=8)}}
    launch(spec, root, 1)
    r = ranks(root)[0]
    return (f"- Full SFT of a random LLaMA-2-7B shape, one GPU, FSDP2 + CPU offload, fp32 masters, bf16 compute: "
            f"{statistics.median(r['step_seconds']):.1f} s/step (batch 8, micro-batch 4); peak GPU "
            f"{r.get('peak_gpu_gib', float('nan')):.1f} GiB, peak host {r['peak_rss_mib'] / 1024:.1f} GiB.")


def gpu_overhead(root: Path) -> str:
    out = []
    for parallel in ("ddp", "fsdp"):
        spec = {"random_init": "smollm2-135m", "train": TRAIN, "threads": 8, "out": str(root / parallel / "out"),
                "device": "cuda",
                "components": CASES["precise (32 heads)"][1],
                "config": {"method": "precise", "parallel": parallel, **dict(RECIPE, max_steps=20)}}
        launch(spec, root / parallel, 1)
        out.append(ranks(root / parallel)[0])
    ddp, fsdp = (statistics.median(r["step_seconds"]) for r in out)
    worst = max(abs(a - b) for a, b in zip(out[0]["losses"], out[1]["losses"]))
    return (f"- Precise SFT of a random SmolLM2-135M shape (32 heads) on one GPU, bf16: DDP {ddp:.3f} s/step, "
            f"FSDP2 (one process) {fsdp:.3f} s/step: overhead **{100 * (fsdp / ddp - 1):+.0f}%**; largest loss "
            f"difference {worst:.1e}.")


def split_inputs(root: Path) -> None:
    """A random SmolLM2-135M-shaped model folder (fp32) and 32 addition pairs for it, no download."""
    import json as _json

    import torch
    import transformers as tf

    from bench.finetune import SHAPES
    from keyheads.testing import char_tokenizer

    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(tf.LlamaConfig(max_position_embeddings=2048, **SHAPES[MODEL]))
    hf.save_pretrained(root / "model")
    char_tokenizer().save_pretrained(root / "model")
    rows = [{"reference": f"Q: {a} + {b} = ", "counterfactual": f"Q: {a} @ {b} = ", "answer": str((a + b) % 10)}
            for a in range(8) for b in range(4)]
    (root / "pairs.jsonl").write_text("".join(_json.dumps(r) + "\n" for r in rows))


def gpu_split(root: Path) -> str:
    import numpy as np

    split_inputs(root)
    times = {}
    for name, flags in {"cuda:0": ["--device", "cuda"],
                        "cuda:0 + cpu": ["--device", "auto", "--max-memory", "0=200MiB,cpu=8GiB"]}.items():
        out = root / name.replace(" ", "").replace(":", "").replace("+", "-")
        t0 = time.perf_counter()
        subprocess.run([*KEYHEADS, "identify", "--model", str(root / "model"), "--data", str(root / "pairs.jsonl"),
                        "--out", str(out), "--dtype", "float32", "--quiet", *flags], check=True,
                       env={**os.environ, "PYTHONPATH": python_path()})
        times[name] = (time.perf_counter() - t0, np.array(Effects.load(out / EFFECTS_JSON).heads))
    (t1, e1), (t2, e2) = times.values()
    return (f"- Path patching of a random SmolLM2-135M shape, fp32: on cuda:0 {t1:.0f} s; split between cuda:0 "
            f"(200 MiB of its 540) and cpu "
            f"{t2:.0f} s; largest effect difference {np.abs(e1 - e2).max():.1e}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("cpu", "resume", "gpu-offload", "gpu-overhead", "gpu-split"))
    parser.add_argument("--keep", help="work folder to keep (default: a temporary one)")
    tiny.add_flags(parser)
    args = parser.parse_args()
    if args.tiny and args.part.startswith("gpu"):
        raise SystemExit("--tiny checks the CPU parts (cpu, resume); the GPU parts need a GPU")
    root = Path(args.keep or tempfile.mkdtemp(prefix="keyheads-fsdp-"))
    job = tiny_job() if args.tiny else Job()
    parts = {"cpu": lambda: cpu(root, job), "resume": lambda: resume(root, job),
             "gpu-offload": lambda: gpu_offload(root), "gpu-overhead": lambda: gpu_overhead(root),
             "gpu-split": lambda: gpu_split(root)}
    body = parts[args.part]()
    when = datetime.date.today().isoformat()
    titles = {"cpu": "Past one process on the CPU: DDP and FSDP2, 1 and 2 processes (bench/fsdp.py cpu)",
              "resume": "FSDP2: a killed full SFT resumed (bench/fsdp.py resume)"}
    title = titles.get(args.part, f"FSDP2 on a GPU (bench/fsdp.py {args.part})")
    where = machine("cuda") if args.part.startswith("gpu") else \
        f"{machine()}; 2 threads in all: one process of 2, or two processes of 1 each"
    command = f"python -m bench.fsdp {args.part}" + (" --tiny" if args.tiny else "")
    write_section(title, f"{provenance(f'bench/fsdp.py {args.part}', where)}\n\n{body}\n\n"
                         f"Measured {when} with `{command}`.", tiny.results_file(args))
    print(body)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
