"""The "what fits where" table: LLaMA-2 7B, 13B and 70B shapes on 1, 2, 4 and 8 GPUs of 80 GiB, as
`keyheads plan` computes it from each config alone (written to a folder as config.json, no weights).

    python -m bench.plan_table            # prints the tables and writes their section of bench/RESULTS.md
    python -m bench.plan_table --tiny     # the same into a temporary RESULTS file (it loads no model: the
                                          # planner's arithmetic takes a second at any size)
"""
from __future__ import annotations

import argparse
import datetime
import tempfile
from pathlib import Path

import transformers

from bench import tiny
from bench.results import provenance, write_section
from keyheads.commands.plan import plan_from
from keyheads.config.commands import PlanCommand

SHAPES = {
    "7B": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
    "13B": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=40, vocab_size=32000),
    "70B": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=32000),
}
GPUS = (1, 2, 4, 8)
GPU_MEMORY = "80GiB"
NAMES = {"finetune precise": "precise SFT (32 heads)", "finetune precise+mlp": "precise SFT + 3 MLPs",
         "finetune lora": "LoRA (rank 8)", "finetune full": "full SFT"}
TRAINING = ("ddp", "fsdp", "fsdp+offload")
TITLE = "What fits where: LLaMA-2 7B, 13B and 70B on 1 to 8 GPUs (bench/plan_table.py)"


def cell(option) -> str:
    if option is None:
        return "does not fit"
    mode = f"{option.mode}, {'micro-batch' if option.mode in TRAINING else 'batch'} {option.micro_batch}"
    host = f", host {option.memory.host / 2**30:.0f} GiB" if option.memory.host else ""
    return f"{mode}: {option.memory.gpu / 2**30:.1f} GiB{host}"


def table(folder: Path) -> str:
    rows = {}
    for gpus in GPUS:
        plan = plan_from(PlanCommand(model=str(folder), gpus=gpus, gpu_memory=GPU_MEMORY))
        for stage in plan.stages:
            rows.setdefault(stage.stage, []).append(cell(stage.chosen))
    lines = ["| stage | " + " | ".join(f"{g} GPU{'s' if g > 1 else ''}" for g in GPUS) + " |",
             "|---" * (len(GPUS) + 1) + "|"]
    lines += [f"| {NAMES.get(stage, stage)} | " + " | ".join(cells) + " |" for stage, cells in rows.items()]
    return "\n".join(lines), plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    tiny.add_flags(parser)
    args = parser.parse_args()
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in SHAPES.items():
            folder = Path(tmp) / name
            folder.mkdir()
            transformers.LlamaConfig(**shape).to_json_file(folder / "config.json")
            text, plan = table(folder)
            s = plan.shape
            parts.append(f"**{name}** ({s.params:,} parameters; {s.n_layers} layers, d_model {s.d_model}, "
                         f"{s.n_heads} heads over {s.n_kv_heads} K/V heads)\n\n{text}")
    w = plan.workload
    where = "none measured: the planner's arithmetic on each config, no GPU"
    body = f"""{provenance("bench/plan_table.py", where)}

Computed {datetime.date.today()} by `keyheads plan` from each model's config alone (no weights, no GPU).
**No entry has been measured on a GPU yet**: these are the planner's estimates, with {w.dtype} compute, fp32
trained weights, gradients and AdamW state. Training: {w.seq_len} tokens a sample, micro-batch {w.micro_batch}
(halved until it fits). Analyses: {w.prompt_len} tokens a prompt, batch {w.batch} (halved until it fits). A cell is
the first mode that fits, with the planned bytes per GPU and, under offload, the host memory per node. The
modes are tried in the order ddp, fsdp, fsdp+offload for training, and gpu (one GPU), auto (device_map over
the GPUs), auto+cpu for the analyses. `keyheads plan --json` gives every
mode's terms; src/keyheads/planning/costs.py lists every constant with where it comes from, and
tests/test_plan.py checks the state bytes exactly and the saved activations per token against a tiny model.

Activations are upper bounds: every token a completion, a trained head in layer 0 (so the backward pass runs
through every layer), the whole vocabulary row of the logits for every position.

{chr(10).join(parts[:1])}

{chr(10).join(parts[1:2])}

{chr(10).join(parts[2:])}

Command: `python -m bench.plan_table` (for one model: `keyheads plan --model FOLDER --gpus 8 --gpu-memory 80GiB`).
"""
    print(body)
    if not args.no_write:
        write_section(TITLE, body, tiny.results_file(args))


if __name__ == "__main__":
    main()
