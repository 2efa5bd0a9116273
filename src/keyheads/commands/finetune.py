"""`keyheads finetune` (precise SFT and its baselines) and `keyheads merge` (fold or export an adapter)."""
from __future__ import annotations

from pathlib import Path

from .dataclass_args import add_dataclass_args, dataclass_from_args, field_docs
from .models import DefaultsFormatter, add_model_args, load_from_args

COMPONENT_FLAGS = ("effects", "top_k", "heads", "random_heads", "mlps", "mlp_layers")


def check_component_args(args, method: str = "precise") -> None:
    """What can be said about the component flags before any model loads (the model's size comes later)."""
    from ..heads import parse_heads, parse_layers

    given = ["--" + k.replace("_", "-") for k in COMPONENT_FLAGS if getattr(args, k, None) not in (None, "")]
    if method != "precise":
        if given:
            raise ValueError(f"{', '.join(given)} choose what --method precise trains; --method {method} trains "
                             + ("every parameter" if method == "full" else "LoRA adapters on the attention projections")
                             + ": leave them out or use --method precise")
        return
    ways = [bool(args.heads), args.random_heads is not None, args.top_k is not None]
    if sum(ways) > 1:
        raise ValueError("choose heads one way: --effects with --top-k, --heads, or --random-heads")
    if (args.top_k is not None or args.mlps) and not args.effects:
        raise ValueError("--top-k and --mlps rank by effect: give --effects effects.json (from `keyheads patch`)")
    if args.mlps and args.mlp_layers:
        raise ValueError("give either --mlps M (the top-M by effect) or --mlp-layers L,... (explicit), not both")
    for flag, value, least in (("--top-k", args.top_k, 0), ("--mlps", args.mlps, 0),
                               ("--random-heads", args.random_heads, 1)):
        if value is not None and value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    if args.heads:
        parse_heads(args.heads)  # a malformed item is named here
    if args.mlp_layers:
        parse_layers(args.mlp_layers)
    if not (args.heads or args.random_heads is not None or args.top_k or args.mlps or args.mlp_layers):
        raise ValueError("precise SFT needs heads or MLPs: --effects F --top-k K, --heads L.H,..., "
                         "--random-heads K, and/or --mlps M / --mlp-layers L,...")
    if args.effects and not Path(args.effects).is_file():
        raise FileNotFoundError(f"--effects {args.effects}: no such file (it is written by `keyheads patch`)")


def components_from_args(args, model, seed: int = 0):
    """Heads (top-k of effects, explicit, or random) and MLPs (top-m of effects, or explicit)."""
    from ..components import Components
    from ..effects import Effects
    from ..heads import parse_layers

    check_component_args(args, "precise")
    effects = Effects.load(args.effects, model) if args.effects else None
    name = Path(args.effects).name if args.effects else ""
    if args.heads:
        chosen = Components.explicit(args.heads)
    elif args.random_heads is not None:
        chosen = Components.random_heads(args.random_heads, model.n_layers, model.n_heads, seed)
    elif args.top_k:
        chosen = Components.select(effects, top_k=args.top_k, name=name)
    else:
        chosen = Components((), (), "no heads")
    if args.mlps:
        ranked = Components.select(effects, top_k=0, n_mlps=args.mlps, name=name)
        chosen = chosen.with_mlps(ranked.mlps, f"top-{args.mlps} MLPs")
    elif args.mlp_layers:
        chosen = chosen.with_mlps(parse_layers(args.mlp_layers), f"MLPs {args.mlp_layers}")
    if not chosen.heads and not chosen.mlps:
        raise ValueError("precise SFT needs heads or MLPs: --effects F --top-k K, --heads L.H,..., "
                         "--random-heads K, and/or --mlps M / --mlp-layers L,...")
    return chosen.check(model.n_layers, model.n_heads)


def cmd_finetune(args) -> int:
    from ..finetune import FinetuneConfig, describe, finetune, load_examples
    from ..settings import apply_common, check_int, check_writable_dir

    apply_common(args)
    cfg = dataclass_from_args(FinetuneConfig, args)  # invalid settings fail here, before any model loads
    check_component_args(args, cfg.method)
    if args.limit is not None:
        check_int("--limit", args.limit, 1)
    check_writable_dir(args.out, "--out")
    examples = load_examples(args.train, data_dir=args.data_dir, seed=cfg.seed)
    if args.limit:
        examples = examples[:args.limit]
    model = load_from_args(args)
    components = components_from_args(args, model, cfg.seed) if cfg.method == "precise" else None
    if components is not None:
        print(f"training {len(components.heads)} heads {', '.join(map(str, components.heads))}"
              + (f" and MLPs {list(components.mlps)}" if components.mlps else "") + f" ({components.source})")
    info = finetune(model, examples, cfg, args.out, components, data_name=args.train, progress=not args.quiet)
    print(describe(info))
    print(f"wrote {args.out}/ (finetune.json, " + {"precise": "adapter.safetensors", "lora": "lora/",
                                                   "full": "model/"}[cfg.method] + ")")
    return 0


def cmd_merge(args) -> int:
    from ..finetune.adapter import export_peft, merge, read_adapter
    from ..models import load_model
    from ..settings import apply_common, check_writable_dir

    apply_common(args)
    _, meta = read_adapter(args.adapter)
    if args.export == "hf" and Path(args.out).exists():  # before the model loads (merge() checks again)
        raise ValueError(f"--out {args.out} exists; choose a new folder")
    check_writable_dir(args.out, "--out")
    model = load_model(args.model or meta["base_model"], device=args.device or "cpu", dtype=args.dtype or "float32")
    if args.export == "peft":
        out = export_peft(model, args.adapter, args.out)
        print(f"wrote a PEFT LoRA adapter to {out}: PeftModel.from_pretrained(base, {str(out)!r})")
    else:
        out = merge(model, args.adapter, args.out)
        print(f"wrote {out}: a plain Hugging Face model folder (AutoModelForCausalLM.from_pretrained)")
    return 0


def register(sub) -> None:
    from ..finetune.config import FinetuneConfig
    from ..settings import add_common_args

    p = sub.add_parser("finetune", help="precise SFT of key heads (and MLPs); full-SFT and LoRA baselines",
                       formatter_class=DefaultsFormatter,
                       description="Train only the chosen heads' Q/K/V/O slices (and whole MLPs), or a baseline. "
                       "Runs on one process or under `accelerate launch` (DDP/FSDP); an interrupted run resumes.")
    add_model_args(p, seed_help=field_docs(FinetuneConfig)["seed"].rstrip("."))
    what = p.add_argument_group("what to train (precise)")
    what.add_argument("--effects", help="effects.json from `keyheads patch`, for --top-k and --mlps")
    what.add_argument("--top-k", type=int, help="the K heads with the most negative effect")
    what.add_argument("--heads", help="explicit heads, e.g. 14.2,21.2")
    what.add_argument("--random-heads", type=int, metavar="K", help="K seeded random heads (the control)")
    what.add_argument("--mlps", type=int, metavar="M", help="also the M MLPs with the most negative effect")
    what.add_argument("--mlp-layers", metavar="L,...", help="also these whole MLP layers")
    data = p.add_argument_group("data")
    data.add_argument("--train", required=True, metavar="SPEC",
                      help="a JSONL of {prompt, completion}; 'trainset' (GSM8K train + held-out AddSub/SingleEq/SVAMP); "
                      "or 'arith:multidigit,decimal[:N]' from the templates")
    data.add_argument("--data-dir", help="benchmarks folder for 'trainset' (default: $KEYHEADS_DATA)")
    data.add_argument("--limit", type=int, help="use only the first N examples")
    add_dataclass_args(p, FinetuneConfig, skip=("seed",),  # --seed is a common flag
                       group_title="training (the paper's recipe by default)")
    p.add_argument("--out", required=True, help="run folder: finetune.json, adapter.safetensors (or lora/, model/), checkpoint/")
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser("merge", help="fold a precise-SFT adapter into a plain HF model folder, or export it as PEFT LoRA",
                       formatter_class=DefaultsFormatter,
                       description="Fold a precise-SFT adapter into its base model, or export it as a PEFT LoRA "
                       "adapter. The base model loads on the CPU in float32 unless --device/--dtype say otherwise.")
    p.add_argument("--adapter", required=True, help="a `keyheads finetune --method precise` run folder")
    p.add_argument("--out", required=True, help="new folder to write")
    p.add_argument("--model", help="base model (default: the one the adapter names)")
    p.add_argument("--export", choices=("hf", "peft"), default="hf",
                   help="hf: merged model folder; peft: the same change as a PEFT LoRA adapter (exact)")
    add_common_args(p, seed_help="merging is deterministic, so the seed changes nothing")
    p.set_defaults(func=cmd_merge)
