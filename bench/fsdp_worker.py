"""One process of bench/fsdp.py (alone, or one of several under torch.distributed.run).

    python -m bench.fsdp_worker SPEC.json RESULT_FOLDER

Trains one case through keyheads.finetune.finetune and writes RESULT_FOLDER/rank{r}.json: peak resident
memory of this process, the frozen-parameter bytes it holds, seconds per optimizer step after the first,
and the losses. With "crash_at": S in the spec, the last process raises while fetching step S's batch,
and the launcher ends the run (a killed run, which the next launch resumes).
"""
import json
import resource
import sys
import time
from pathlib import Path

import torch


def random_model(shape: str, device: str, dtype: str):
    """A randomly initialised Llama of a named shape (bench/finetune.py's SHAPES): no weights needed."""
    import transformers as tf

    from bench.finetune import SHAPES
    from keyheads.models.model import HookedModel
    from keyheads.testing import char_tokenizer

    torch.manual_seed(0)
    with torch.device(device):
        hf = tf.AutoModelForCausalLM.from_config(tf.LlamaConfig(max_position_embeddings=4096, **SHAPES[shape]),
                                                 dtype=getattr(torch, dtype))
    return HookedModel(hf, char_tokenizer(), name=f"random {shape}")


def main(spec_path: str, results: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import keyheads.finetune.train as train_mod
    from keyheads import distributed
    from keyheads.components import Components
    from keyheads.finetune import load_examples
    from keyheads.finetune.run import finetune
    from keyheads.finetune.settings import FinetuneSettings
    from keyheads.log import configure
    from keyheads.models import load_placed, place

    configure()  # the "resuming from" note on stderr
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec.get("threads", 1))
    cfg = FinetuneSettings.from_json(spec["config"])
    examples = load_examples(spec["train"], seed=0)
    where = place(spec.get("device"), sharded=cfg.parallel == "fsdp")
    train_on = where.run_on
    dtype = "bfloat16" if train_on.startswith("cuda") else "float32"
    model = random_model(spec["random_init"], where.load_on, dtype) if spec.get("random_init") else \
        load_placed(spec["model"], spec.get("device"), dtype, sharded=cfg.parallel == "fsdp")[0]
    loaded_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the whole model, before any sharding
    components = Components.from_json(spec["components"]) if spec.get("components") else None
    optimizers, make = [], train_mod.make_optimizer
    train_mod.make_optimizer = lambda tuned, cfg: optimizers.append(make(tuned, cfg)) or optimizers[-1]
    stamps, real = [], train_mod.batch_indices

    def batch(step, *args):
        stamps.append(time.perf_counter())
        if spec.get("crash_at") == step and distributed.rank() == distributed.world() - 1:
            raise RuntimeError(f"simulated kill at step {step}")
        return real(step, *args)

    train_mod.batch_indices = batch
    info = finetune(model, examples, cfg, spec["out"], components, progress=False, device=train_on)
    rank = dist.get_rank() if dist.is_initialized() else 0
    frozen = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
                 for p in model.hf.parameters() if not p.requires_grad)
    def here(t) -> int:  # bytes of this process's part of a tensor
        return (t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size()

    trained = [p for p in model.hf.parameters() if p.requires_grad]
    state = sum(here(p) + (here(p.grad) if p.grad is not None else 0) for p in trained)
    state += sum(here(v) for s in optimizers[-1].state.values() for v in s.values() if torch.is_tensor(v))
    steps = [b - a for a, b in zip(stamps[1:], stamps[2:])]  # the first step warms up; the last has no end
    facts = {"rank": rank, "world": distributed.world(), "parallel": info.train.parallel,
             "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             "frozen_mib_here": frozen / 2**20, "trained_state_mib_here": state / 2**20,
             "loaded_rss_mib": loaded_rss, "device": train_on,
             "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
             "step_seconds": steps, "losses": info.train.losses}
    Path(results).mkdir(parents=True, exist_ok=True)
    (Path(results) / f"rank{rank}.json").write_text(json.dumps(facts, indent=1))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
