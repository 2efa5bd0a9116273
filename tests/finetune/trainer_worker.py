"""One process of the Trainer-under-FSDP2 test in test_integration_fsdp.py, started by `accelerate launch`:

    accelerate launch --use_fsdp --fsdp_version 2 --num_processes 2 ... trainer_worker.py SPEC.json RESULTS

SPEC.json: {folder (a Hugging Face model folder), components, rows (tokenized examples in the order the
trainer takes them: input_ids, labels), args (TrainingArguments), out (where the callback writes the
adapter)}. Every process attaches precise SFT to the folder's model and trains it with a plain
transformers Trainer, as a user's script does; the FSDP2 set-up is accelerate's, from the launcher's
variables. Each writes RESULTS/rank{r}.json: what ran (world, backend, FSDP version, whether the deltas
were sharded), how many gradients the H/h hooks scaled, and which process wrote an adapter where.

`train` is also what the test runs in its own process for the single-process reference.
"""
import json
import sys
from pathlib import Path

import torch


def fsdp_on_cpu() -> None:
    """accelerate (1.15) keeps an FSDP plugin only on accelerator devices: AcceleratorState sets
    `distributed_type = FSDP` for MULTI_GPU, MULTI_NPU, MULTI_XPU and the like, and drops the plugin for
    MULTI_CPU. torch's FSDP2 itself runs on CPUs over gloo, so on a machine without a GPU do for MULTI_CPU
    what accelerate does for those; everything after (accelerate's fully_shard of the model, its move of the
    optimizer onto the shards, the Trainer's FSDP2 paths) is the code a GPU run takes."""
    from accelerate.state import AcceleratorState, DistributedType, PartialState

    init = AcceleratorState.__init__

    def patched(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = patched


def train(folder, components, rows: list[dict], args: dict, out, fsdp: bool = False, callbacks=(),
          resume_from_checkpoint: str | None = None):
    """Attach precise SFT to the folder's model and train it with transformers.Trainer; -> (model, handle,
    trainer). With `fsdp`, the optimizer is given as the Trainer takes it under FSDP (optimizer_cls_and_kwargs)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments

    from keyheads.finetune import attach

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sft = attach(model, components)
    arguments = TrainingArguments(**args)
    optimizer = (dict(optimizer_cls_and_kwargs=sft.optimizer_cls_and_kwargs(arguments)) if fsdp
                 else dict(optimizers=(sft.optimizer(arguments), None)))
    trainer = Trainer(model=model, args=arguments, train_dataset=Dataset.from_list(rows),
                      data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True),
                      callbacks=[sft.callback(out), *callbacks], **optimizer)
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return model, sft, trainer


def main(spec_path: str, results: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import keyheads.finetune.integration as integration
    from keyheads.components import Components
    from keyheads.finetune.layer import ATTR

    torch.set_num_threads(1)
    fsdp_on_cpu()
    spec = json.loads(Path(spec_path).read_text())
    writes = []
    save_adapter = integration.save_adapter

    def counted(tuned, out, *args, **kwargs):
        writes.append(str(out))
        return save_adapter(tuned, out, *args, **kwargs)

    integration.save_adapter = counted
    scaled = integration._scaled
    rescaled = [0]

    def counted_scale(grad, scale):
        rescaled[0] += 1
        return scaled(grad, scale)

    integration._scaled = counted_scale
    model, sft, trainer = train(spec["folder"], Components.from_json(spec["components"]), spec["rows"], spec["args"],
                                spec["out"], fsdp=True)
    state = trainer.accelerator.state
    deltas = [p for n, p in model.named_parameters() if ATTR in n]
    facts = {"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": dist.get_backend(),
             "distributed_type": str(state.distributed_type), "fsdp_version": state.fsdp_plugin.fsdp_version,
             "deltas_sharded": bool(deltas) and all(isinstance(p, DTensor) for p in deltas),
             "frozen_sharded": all(isinstance(p, DTensor) for p in model.parameters()),
             "losses": [row["loss"] for row in trainer.state.log_history if "loss" in row], "writes": writes,
             "rescaled_gradients": rescaled[0]}
    folder = Path(results)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{facts['rank']}.json").write_text(json.dumps(facts, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
