"""`keyheads finetune` (precise SFT and its baselines) and `keyheads merge` (fold or export an adapter)."""
from __future__ import annotations

from .. import finetune as training  # training.finetune looked up at call time: tests count its calls
from .. import models
from ..config.base import take
from ..config.commands import FinetuneCommand, MergeCommand
from ..errors import SettingError
from ..selection import ComponentChoice
from .flags import add_settings, settings
from .models import resident_only
from .timing import work_time


def check_method_choice(choice: ComponentChoice, method: str) -> None:
    """Only precise SFT chooses components (each flag and how they combine are checked by ComponentChoice)."""
    if method != "precise" and choice.given:
        raise SettingError(f"{', '.join(choice.given)} choose what --method precise trains; --method {method} trains "
                           + ("every parameter" if method == "full" else "LoRA adapters on the attention projections")
                           + ": leave them out or use --method precise")


def cmd_finetune(args) -> int:
    cfg: FinetuneCommand = settings(args)  # invalid settings fail here, before any model loads
    from .. import distributed
    from ..finetune.model import check_components
    from ..finetune.parallel import check_setup

    resident_only(cfg, "finetune")
    recipe = cfg.recipe()
    choice = take(cfg, ComponentChoice)
    check_method_choice(choice, recipe.method)
    if recipe.method == "precise" and not (choice.heads or choice.top_k is not None or choice.threshold is not None
                                           or choice.random_heads is not None or choice.mlps or choice.mlp_layers):
        check_components(None)  # no flag chooses any: said before the model loads
    check_setup(recipe, cfg.device, distributed.world())
    examples = training.load_examples(cfg.train, data_dir=cfg.data_dir, seed=recipe.seed)
    if cfg.limit:
        examples = examples[:cfg.limit]
    model, where = models.load_placed(cfg.model, cfg.device, cfg.dtype, sharded=recipe.parallel == "fsdp")
    components = check_components(choice.components(model, recipe.seed)) if recipe.method == "precise" else None
    if components is not None:
        print(f"training {len(components.heads)} heads {', '.join(map(str, components.heads))}"
              + (f" and MLPs {list(components.mlps)}" if components.mlps else "") + f" ({components.source})")
    with work_time("finetune", cfg.out):
        info = training.finetune(model, examples, recipe, cfg.out, components, data_name=cfg.train,
                                 progress=not cfg.quiet, device=where.run_on)
        if distributed.is_main():  # one summary, however many processes trained
            print(training.describe(info))
            print(f"wrote {cfg.out}/ (finetune.json, " + {"precise": "adapter.safetensors", "lora": "lora/",
                                                          "full": "model/"}[recipe.method] + ", timing.json)")
    return 0


def cmd_merge(args) -> int:
    cfg: MergeCommand = settings(args)
    from ..finetune.adapter import check_new_folder, export_peft, merge, read_adapter

    resident_only(cfg, "merge")
    _, meta = read_adapter(cfg.adapter)  # a broken adapter is said before the model loads
    if cfg.export == "hf":
        check_new_folder(cfg.out)  # before the model loads (merge() checks again)
    # merging is exact in float32 on the CPU unless --device/--dtype say otherwise
    model, _ = models.load_placed(cfg.model or meta["base_model"], cfg.device or "cpu", cfg.dtype or "float32")
    if cfg.export == "peft":
        out = export_peft(model, cfg.adapter, cfg.out)
        print(f"wrote a PEFT LoRA adapter to {out}: PeftModel.from_pretrained(base, {str(out)!r})")
    else:
        out = merge(model, cfg.adapter, cfg.out)
        print(f"wrote {out}: a plain Hugging Face model folder (AutoModelForCausalLM.from_pretrained)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("finetune", help="precise SFT of key heads (and MLPs); full-SFT and LoRA baselines",
                       description="Train only the chosen heads' Q/K/V/O slices (and whole MLPs), or a baseline. "
                       "Runs on one process or under `accelerate launch` (DDP/FSDP); an interrupted run resumes.")
    add_settings(p, FinetuneCommand)
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser(
        "merge",
        help="fold a precise-SFT adapter into a plain HF model folder, or export it as PEFT LoRA",
        description="Fold a precise-SFT adapter into its base model, or export it as a PEFT LoRA "
        "adapter. The base model loads on the CPU in float32 unless --device/--dtype say otherwise.",
    )
    add_settings(p, MergeCommand)
    p.set_defaults(func=cmd_merge)
