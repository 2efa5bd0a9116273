"""`keyheads finetune` (precise SFT and its baselines) and `keyheads merge` (fold or export an adapter)."""
from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from .. import distributed, models
from .. import finetune as training  # training.finetune looked up at call time: tests count its calls
from ..components import Components
from ..config.commands import FinetuneCommand, MergeCommand
from ..effects import Effects
from ..errors import SettingError
from ..finetune.adapter import check_new_folder, export_peft, merge, read_adapter
from ..finetune.model import check_components
from ..finetune.parallel import check_setup
from ..heads import parse_layers
from .flags import add_settings, settings
from .models import resident_only

T = TypeVar("T")
COMPONENT_FLAGS = ("effects", "top_k", "heads", "random_heads", "mlps", "mlp_layers")


def check_component_args(args, method: str = "precise") -> None:
    """How the component flags combine, before any model loads (each flag's own value is checked by the settings
    model, FinetuneCommand; the model's size comes later)."""
    given = ["--" + k.replace("_", "-") for k in COMPONENT_FLAGS if getattr(args, k, None) not in (None, "")]
    if method != "precise":
        if given:
            raise SettingError(f"{', '.join(given)} choose what --method precise trains; --method {method} trains "
                             + ("every parameter" if method == "full" else "LoRA adapters on the attention projections")
                             + ": leave them out or use --method precise")
        return
    ways = [bool(args.heads), args.random_heads is not None, args.top_k is not None]
    if sum(ways) > 1:
        raise SettingError("choose heads one way: --effects with --top-k, --heads, or --random-heads")
    if args.top_k is not None or args.mlps:
        _ranked_by(args.effects)
    if args.mlps and args.mlp_layers:
        raise SettingError("give either --mlps M (the top-M by effect) or --mlp-layers L,... (explicit), not both")
    if not (args.heads or args.random_heads is not None or args.top_k or args.mlps or args.mlp_layers):
        check_components(None)  # no flag chooses any


def _ranked_by(effects: T | None) -> T:
    """The one check that ranking by effect (--top-k, --mlps) has effects to rank by."""
    if effects is None:
        raise SettingError("--top-k and --mlps rank by effect: give --effects effects.json (from `keyheads patch`)")
    return effects


def components_from_args(args, model, seed: int = 0):
    """Heads (top-k of effects, explicit, or random) and MLPs (top-m of effects, or explicit); the flags were
    checked by check_component_args."""
    effects = Effects.load(args.effects, model) if args.effects else None
    name = Path(args.effects).name if args.effects else ""
    if args.heads:
        chosen = Components.explicit(args.heads)
    elif args.random_heads is not None:
        chosen = Components.random_heads(args.random_heads, model.n_layers, model.n_heads, seed)
    elif args.top_k:
        chosen = Components.select(_ranked_by(effects), top_k=args.top_k, name=name)
    else:
        chosen = Components((), (), "no heads")
    if args.mlps:
        ranked = Components.select(_ranked_by(effects), top_k=0, n_mlps=args.mlps, name=name)
        chosen = chosen.with_mlps(ranked.mlps, f"top-{args.mlps} MLPs")
    elif args.mlp_layers:
        chosen = chosen.with_mlps(parse_layers(args.mlp_layers), f"MLPs {args.mlp_layers}")
    return check_components(chosen).check(model.n_layers, model.n_heads)


def cmd_finetune(args) -> int:
    cfg: FinetuneCommand = settings(args)  # invalid settings fail here, before any model loads
    resident_only(cfg, "finetune")
    recipe = cfg.recipe()
    check_component_args(cfg, recipe.method)
    check_setup(recipe, cfg.device, distributed.world())
    examples = training.load_examples(cfg.train, data_dir=cfg.data_dir, seed=recipe.seed)
    if cfg.limit:
        examples = examples[:cfg.limit]
    model, where = models.load_placed(cfg.model, cfg.device, cfg.dtype, sharded=recipe.parallel == "fsdp")
    components = components_from_args(cfg, model, recipe.seed) if recipe.method == "precise" else None
    if components is not None:
        print(f"training {len(components.heads)} heads {', '.join(map(str, components.heads))}"
              + (f" and MLPs {list(components.mlps)}" if components.mlps else "") + f" ({components.source})")
    info = training.finetune(model, examples, recipe, cfg.out, components, data_name=cfg.train, progress=not cfg.quiet,
                             device=where.run_on)
    if distributed.is_main():  # one summary, however many processes trained
        print(training.describe(info))
        print(f"wrote {cfg.out}/ (finetune.json, " + {"precise": "adapter.safetensors", "lora": "lora/",
                                                      "full": "model/"}[recipe.method] + ")")
    return 0


def cmd_merge(args) -> int:
    cfg: MergeCommand = settings(args)
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
