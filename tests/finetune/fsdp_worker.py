"""One process of the FSDP2 tests in test_fsdp.py, under torch.distributed.run or alone (a group of one).

    python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp_worker.py SPEC.json RESULTS

SPEC.json holds the examples and a list of runs: {name, family, components (or null), config, out,
crash_at, folder, whole, dtype (the last four optional)}. For each run every process trains a fresh tiny
model (or the one saved in `folder`, loaded as `keyheads finetune` loads it, or loaded whole) through
`finetune` with config.parallel "fsdp" into OUT and writes RESULTS/NAME/rank{r}.json: the losses, the bytes
of frozen parameters this process holds against the whole model's, and the peak of its anonymous resident
memory before loading and at the end (meaningful for the first run of a launch: a peak never falls). With
crash_at S, rank 1 (or rank 0 when alone) raises while fetching step S's batch, and the launcher ends the
run: a killed run.
"""
import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
def main(spec_path: str, results: str) -> None:
    import torch.distributed as dist
    import transformers.optimization  # noqa: F401 - what training imports (peft, bitsandbytes) before the baseline
    from torch.distributed.tensor import DTensor

    import keyheads.finetune.train as train_mod
    from keyheads import models
    from keyheads.components import Components
    from keyheads.finetune.data import Example
    from keyheads.finetune.run import finetune
    from keyheads.finetune.settings import FinetuneSettings
    from keyheads.log import configure
    from keyheads.testing import tiny_model
    from keyheads.testing.memory import STATUS, AnonymousPeak

    configure()  # the "resuming from ..." note on stderr
    memory = AnonymousPeak() if STATUS.is_file() else None
    spec = json.loads(Path(spec_path).read_text())
    examples = [Example(**e) for e in spec["examples"]]
    real_batch = train_mod.batch_indices
    for run in spec["runs"]:
        cfg = FinetuneSettings.from_json(run["config"])
        components = Components.from_json(run["components"]) if run["components"] else None
        anon_before = memory.peak if memory else 0  # the runtime and its libraries, before any model
        dtype = run.get("dtype", "float32")
        if run.get("whole"):  # the model loaded whole by every process, then sharded (the way before models.sharded)
            model, _ = models.load_placed(run["folder"], "cpu", dtype)
        elif run.get("folder"):  # as `keyheads finetune --parallel fsdp` loads: no weights until sharded
            model, _ = models.load_placed(run["folder"], "cpu", dtype, sharded=True)
        else:
            model = tiny_model(run["family"], seed=0)
        frozen_whole = sum(p.numel() * p.element_size() for p in model.hf.parameters())
        crash_at = run.get("crash_at")

        def batch(step, *args, crash_at=crash_at):
            rank = dist.get_rank() if dist.is_initialized() else 0
            world = dist.get_world_size() if dist.is_initialized() else 1
            if crash_at is not None and step == crash_at and rank == world - 1:
                raise RuntimeError(f"simulated kill at step {step}")
            return real_batch(step, *args)

        train_mod.batch_indices = batch
        info = finetune(model, examples, cfg, run["out"], components, progress=False)
        rank = dist.get_rank()
        frozen_here = sum(p.to_local().numel() * p.element_size() if isinstance(p, DTensor) else
                          p.numel() * p.element_size() for p in model.hf.parameters() if not p.requires_grad)
        frozen_all = sum(p.numel() * p.element_size() for p in model.hf.parameters() if not p.requires_grad)
        facts = {"rank": rank, "world": dist.get_world_size(), "backend": dist.get_backend(),
                 "losses": info.train.losses, "parallel": info.train.parallel,
                 "frozen_bytes_here": frozen_here, "frozen_bytes_all": frozen_all, "model_bytes": frozen_whole,
                 "sharded": all(isinstance(p, DTensor) for p in model.hf.parameters()),
                 "anon_before_load": anon_before, "anon_peak": memory.peak if memory else 0}
        folder = Path(results) / run["name"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{rank}.json").write_text(json.dumps(facts, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
