"""One process of the two-process test in test_distributed.py (launched by torch.distributed.run).

    python -m torch.distributed.run --standalone --nproc_per_node 2 ddp_worker.py SPEC.json OUT RESULTS

SPEC.json holds the examples, the components and named settings ("runs"). For each run NAME,
every process trains a fresh tiny llama through `finetune` into OUT/NAME and writes
RESULTS/NAME/rank{r}.safetensors (its trainable tensors) and RESULTS/NAME/rank{r}.json (what DDP
reduces, which files this process wrote, the losses).
"""
import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)


def main(spec_path: str, out: str, results: str) -> None:
    from safetensors.torch import save_file
    from torch.nn.parallel import DistributedDataParallel

    import keyheads.finetune.adapter as adapter_mod
    import keyheads.finetune.checkpoint as checkpoint_mod
    import keyheads.finetune.run as run_mod
    from keyheads.components import Components
    from keyheads.finetune.data import Example
    from keyheads.finetune.run import finetune
    from keyheads.finetune.settings import FinetuneSettings
    from keyheads.testing import tiny_model

    spec = json.loads(Path(spec_path).read_text())
    examples = [Example(**e) for e in spec["examples"]]
    components = Components.from_json(spec["components"])

    # Count the files each process writes: only the main process may write any.
    writes = {"adapter": 0, "info": 0, "checkpoint": 0}

    def counting(fn, key, only=None):
        def wrapped(*args, **kwargs):
            if only is None or only(*args):
                writes[key] += 1
            return fn(*args, **kwargs)
        return wrapped

    run_mod.save_adapter = counting(run_mod.save_adapter, "adapter")
    run_mod.write_json = counting(run_mod.write_json, "info", lambda path, *_: Path(path).name == adapter_mod.INFO)
    checkpoint_mod.save_file = counting(checkpoint_mod.save_file, "checkpoint")

    from keyheads.finetune.train import make_accelerator

    acc = make_accelerator(cpu=True)  # what finetune() makes by itself
    prepared = []  # what train() got back from acc.prepare: the DDP wrapper under several processes
    prepare = acc.prepare
    acc.prepare = lambda *args, **kwargs: prepared.append(prepare(*args, **kwargs)) or prepared[-1]
    r = acc.process_index
    for name, config in spec["runs"].items():
        cfg = FinetuneSettings.from_json(config)
        for key in writes:
            writes[key] = 0
        model = tiny_model("llama", seed=0)
        info = finetune(model, examples, cfg, Path(out) / name, components, accelerator=acc, progress=False)

        wrapped = prepared[-1]
        trainable = {n: p for n, p in model.hf.named_parameters() if p.requires_grad}
        facts = {"rank": r, "world": acc.num_processes, "distributed_type": str(acc.distributed_type),
                 "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
                 "is_ddp": isinstance(wrapped, DistributedDataParallel), "writes": dict(writes),
                 "losses": info.train.losses, "n_trainable_tensors": len(trainable),
                 "n_trainable_bytes": sum(p.numel() * p.element_size() for p in trainable.values()),
                 "n_model_tensors": sum(1 for _ in model.hf.parameters())}
        if facts["is_ddp"]:
            logging = wrapped._get_ddp_logging_data()
            reduced = wrapped._build_params_for_reducer()[0]
            facts.update(find_unused_parameters=wrapped.find_unused_parameters,
                         broadcast_buffers=wrapped.broadcast_buffers,
                         ddp_num_parameter_tensors=logging.get("num_parameter_tensors"),
                         ddp_total_parameter_size_bytes=logging.get("total_parameter_size_bytes"),
                         ddp_reduced_ids_are_trainable={id(p) for p in reduced} == {id(p) for p in trainable.values()})
        folder = Path(results) / name
        folder.mkdir(parents=True, exist_ok=True)
        save_file({n: p.detach().contiguous() for n, p in trainable.items()}, str(folder / f"rank{r}.safetensors"))
        (folder / f"rank{r}.json").write_text(json.dumps(facts, indent=2))
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:4])
