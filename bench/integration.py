"""Precise SFT through TRL's SFTTrainer (keyheads.finetune.attach) against `keyheads finetune`, on one job.

    python -m bench.integration                 # SmolLM2-135M on the CPU, 8 heads, batch 8, 5 steps
    python -m bench.integration --rounds 2      # each side twice, in the order A B B A
    python -m bench.integration --tiny --json OUT.json   # a check in seconds: a tiny random model, 4 heads,
                                                         # batch 2, 2 steps; the summary also written to OUT.json

Both sides train the same 8 heads of the bundled SmolLM2-135M (float32) with the same recipe (AdamW,
lr 2e-5, decay 0.1, clipping 1.0, warm-up ratio 0.02, linear decay) on the same 40 arithmetic examples in
the same order (keyheads' order, fed to the trainer with a sequential sampler), batch 8 in one micro-batch,
5 steps. TRL's gradient checkpointing and bf16 are off, as keyheads has neither on the CPU: what is left is
the cost of the trainer and of the integration's hooks. The heads come from a key_heads.json written here
(8 heads of layers 10 to 25: the cost depends on how many slices and where, not on which heads).

A third side runs the trainer without the integration's two hooks (H/h rescale, decay of W0 + delta), so
that the integration's own cost is told apart from the trainer's.

It prints, per side: the mean and median seconds per optimizer step (keyheads: its own step times; the
trainer: from one step's end to the next, so data loading and logging count), the wall time of the whole
call (model already loaded; tokenising, training and writing the adapter), and how far the trained deltas
of the two sides differ (largest relative norm per tensor). It also counts the lines a user adds or
changes in a plain SFTTrainer script: the README's example against the same script without keyheads.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench import tiny

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
RECIPE = dict(lr=2e-5, weight_decay=0.1, max_grad_norm=1.0, warmup_ratio=0.02, seed=0)


@dataclass(frozen=True)
class Job:
    """What both sides train: the heads, on how many examples, in which batches, for how many steps."""

    heads: tuple[tuple[int, int], ...] = ((10, 0), (12, 4), (14, 8), (16, 2), (19, 5), (21, 1), (23, 7), (25, 3))
    n: int = 40
    batch: int = 8
    steps: int = 5


TINY = Job(heads=((0, 0), (1, 1), (2, 2), (2, 3)), n=4, batch=2, steps=2)  # heads of the tiny model's 3 x 4

# The README example's script as a user has it before precise SFT: the same, less the keyheads lines.
PLAIN = '''import os
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

MODEL = os.environ.get("MODEL", "HuggingFaceTB/SmolLM2-135M")
chats = [{"user": "What is 17 + 25?", "bot": "42"}, {"user": "What is 8 * 7?", "bot": "56"},
         {"user": "What is 90 - 33?", "bot": "57"}, {"user": "What is 6 + 9?", "bot": "15"}]  # your own format
data = Dataset.from_list([{"prompt": f"Question: {c['user']}\\nAnswer:", "completion": f" {c['bot']}"} for c in chats])
model, tokenizer = AutoModelForCausalLM.from_pretrained(MODEL), AutoTokenizer.from_pretrained(MODEL)

args = SFTConfig(output_dir="runs/ft/trl", learning_rate=2e-5, weight_decay=0.1, num_train_epochs=2,
                 bf16=torch.cuda.is_available())
trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
trainer.train()
'''


def readme_example() -> str:
    section = (ROOT / "README.md").read_text().split("## Improve: precise SFT", 1)[1].split("\n## ", 1)[0]
    return next(b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "SFTTrainer" in b)


def lines_changed() -> dict:
    """Lines added and removed from the plain script to the README's, ignoring comments and blank lines."""
    def code(text):
        return [line.split("  #")[0].rstrip() for line in text.splitlines() if line.strip()]
    diff = list(difflib.unified_diff(code(PLAIN), code(readme_example()), lineterm="", n=0))
    added = [d[1:] for d in diff if d.startswith("+") and not d.startswith("+++")]
    removed = [d[1:] for d in diff if d.startswith("-") and not d.startswith("---")]
    # A constant the README reads so that its test can point it at a tiny model is not a user's change.
    added = [a for a in added if not a.startswith("KEY_HEADS =")]
    return {"added": len(added), "removed": len(removed), "added_lines": added, "removed_lines": removed}


def examples(job: Job):
    from keyheads.finetune.data import arithmetic_examples
    from keyheads.finetune.train import batch_indices

    rows = arithmetic_examples("multidigit", job.n)
    order = [i for step in range(job.steps) for i in batch_indices(step, job.n, job.batch, RECIPE["seed"])]
    return rows, [rows[i] for i in order]


def keyheads_side(location: str, key_heads: Path, out: Path, job: Job) -> dict:
    from keyheads.components import Components
    from keyheads.finetune import FinetuneSettings, finetune, run
    from keyheads.finetune.train import train
    from keyheads.models.loading import load_model

    model = load_model(location, device="cpu", dtype="float32")
    rows, _ = examples(job)
    cfg = FinetuneSettings(**RECIPE, optimizer_batch_size=job.batch, micro_batch_size=job.batch, max_steps=job.steps,
                           save_every=0, save_minutes=0)
    # finetune.json keeps the sum of the step times; the loop's own TrainResult has each one
    results = []

    def keep(*args, **kwargs):
        results.append(train(*args, **kwargs))
        return results[-1]

    run.train = keep
    try:
        t0 = time.perf_counter()
        finetune(model, rows, cfg, out, Components.read_key_heads(key_heads), progress=False)
        wall = time.perf_counter() - t0
    finally:
        run.train = train
    times = results[0].step_seconds
    return {"wall_s": wall, "mean_step_s": statistics.mean(times), "median_step_s": statistics.median(times),
            "model": model.hf}


def trainer_side(location: str, key_heads: Path, out: Path, job: Job, hooks: bool = True) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from keyheads.finetune import attach
    from keyheads.finetune.data import tokenize
    from keyheads.finetune.train import make_optimizer

    class Steps(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.marks = [time.perf_counter()]

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

    model = AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(location)
    _, ordered = examples(job)
    steps = Steps()
    t0 = time.perf_counter()
    sft = attach(model, key_heads, rescale=hooks)
    args = SFTConfig(output_dir=str(out / "trainer"), per_device_train_batch_size=job.batch, max_steps=job.steps,
                     learning_rate=RECIPE["lr"], weight_decay=RECIPE["weight_decay"],
                     max_grad_norm=RECIPE["max_grad_norm"], warmup_steps=RECIPE["warmup_ratio"],
                     lr_scheduler_type="linear", seed=RECIPE["seed"], train_sampling_strategy="sequential",
                     bf16=False, gradient_checkpointing=False, logging_steps=1, save_strategy="no", use_cpu=True,
                     disable_tqdm=True, report_to="none")
    data = Dataset.from_list([{"prompt": e.prompt, "completion": e.completion} for e in ordered])
    optimizer = sft.optimizer(args) if hooks else make_optimizer(sft.tuned, sft.recipe(args))
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                         optimizers=(optimizer, None), callbacks=[sft.callback(out / "adapter"), steps])
    trainer.train()
    wall = time.perf_counter() - t0
    times = [b - a for a, b in zip(steps.marks, steps.marks[1:])]
    want = tokenize(tokenizer, ordered, 1024)
    same = sum(row["input_ids"] == t.ids for row, t in zip(trainer.train_dataset, want))
    return {"wall_s": wall, "mean_step_s": statistics.mean(times), "median_step_s": statistics.median(times),
            "same_tokens": f"{same}/{len(want)}", "model": model}


def deltas(module) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in module.named_parameters() if "keyheads_delta" in n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side (order A B B A ...)")
    parser.add_argument("--tiny", action="store_true", help="check the script end to end in seconds: a tiny random "
                        "model, 4 heads, batch 2, 2 steps")
    parser.add_argument("--json", type=Path, help="also write the summary printed last to this file")
    args = parser.parse_args()
    from keyheads.io import write_json
    from keyheads.models.loading import load_model

    job = TINY if args.tiny else Job()
    model = str(tiny.model_folder()) if args.tiny else MODEL
    location = load_model(model, device="cpu").source  # the converted folder a user would load
    sides = {"keyheads finetune": keyheads_side, "SFTTrainer + attach": trainer_side,
             "SFTTrainer + attach, no rescale/decay hooks": lambda *a: trainer_side(*a, hooks=False)}
    results: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        key_heads = root / "key_heads.json"
        write_json(key_heads, {"heads": [{"layer": layer, "head": head} for layer, head in job.heads]})
        order = []
        for r in range(args.rounds):
            order += list(sides)[:: 1 if r % 2 == 0 else -1]
        trained = {}
        for i, side in enumerate(order):
            result = sides[side](location, key_heads, root / f"run{i}", job)
            trained[side] = deltas(result.pop("model"))
            results[side].append(result)
            print(side, json.dumps(result), flush=True)
    a, b = trained["keyheads finetune"], trained["SFTTrainer + attach"]
    relative = max(((a[n] - b[n]).norm() / a[n].norm()).item() for n in a)
    summary = {side: {"mean_step_s": round(statistics.mean(r["mean_step_s"] for r in rs), 4),
                      "median_step_s": round(statistics.mean(r["median_step_s"] for r in rs), 4),
                      "wall_s": round(statistics.mean(r["wall_s"] for r in rs), 3)} for side, rs in results.items()}
    k = summary["keyheads finetune"]["mean_step_s"]
    report = {"summary": summary,
              "per_step_vs_keyheads": {side: f"{100 * (v['mean_step_s'] / k - 1):+.1f}%"
                                       for side, v in summary.items()},
              "deltas_max_relative_difference": relative, "threads": torch.get_num_threads(),
              "user_lines": lines_changed()}
    print(json.dumps(report, indent=2))
    if args.json:
        write_json(args.json, report)


if __name__ == "__main__":
    main()
