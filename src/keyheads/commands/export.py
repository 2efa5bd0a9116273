"""`keyheads export`: a run's key heads and effects for other circuit tools (keyheads.circuits has the formats).

circuit.json is a MIB circuit-track / EAP-IG graph: the key heads (and the top --mlps MLPs) in the graph, every
head and MLP scored by its effect; hooks.json names the same components as TransformerLens hook points. Both
read back as --heads, and circuit.json as --effects, of every command that takes them.
"""
from __future__ import annotations

from pathlib import Path

from .. import circuits
from ..config.commands import ExportCommand
from ..effects import Effects
from ..errors import MissingFile, SettingError
from ..io import write_json
from ..results.identify import KeyHeads
from ..runfolder import EFFECTS_JSON, KEY_HEADS_JSON, RunFolder
from .flags import add_settings, settings

CIRCUIT_JSON = "circuit.json"
HOOKS_JSON = "hooks.json"


def identify_folder(folder: Path) -> Path:
    """The folder holding effects.json: `folder` itself, or a run folder's identify/."""
    for candidate in (folder, RunFolder(folder).identify):
        if (candidate / EFFECTS_JSON).is_file():
            return candidate
    raise MissingFile(f"{folder} has no {EFFECTS_JSON} (nor identify/{EFFECTS_JSON}): give a run folder whose "
                      "identify stage finished, or a `keyheads identify` output folder")


def model_shape(cfg: ExportCommand, identify: Path) -> tuple[int, bool, str | None]:
    """(d_model, parallel_attn_mlp, the model whose config gave them) from the flags, else from the model's config:
    the one --model names, else the one in the model.json of the run that holds `identify`."""
    if cfg.d_model is not None and cfg.parallel_attn_mlp is not None:
        return cfg.d_model, cfg.parallel_attn_mlp, None
    name = cfg.model
    if name is None:
        for root in (identify, *identify.parents[:2]):  # identify/, identify/NAME/ or the run folder itself
            record = RunFolder(root).model_record
            if record is not None:
                name = record.source
                break
    if name is None:
        raise SettingError(f"no model.json in or above {identify} says which model the run used: give --model, or "
                           "--d-model and --parallel-attn-mlp / --no-parallel-attn-mlp")
    # the model code imports torch: only when a config must be read
    from ..models.families import family_for
    from ..planning.shape import load_config

    config = load_config(name)
    fam = family_for(config.model_type)
    d_model = cfg.d_model if cfg.d_model is not None else fam.d_model(config)
    parallel = cfg.parallel_attn_mlp if cfg.parallel_attn_mlp is not None else bool(fam.parallel_residual(config))
    return int(d_model), parallel, name


def cmd_export(args) -> int:
    cfg: ExportCommand = settings(args)
    identify = identify_folder(Path(cfg.folder))
    effects = Effects.load(identify / EFFECTS_JSON)
    keys = KeyHeads.read(identify / KEY_HEADS_JSON)
    if cfg.mlps > len(keys.mlps):
        raise SettingError("--mlps", cfg.mlps, f"{identify / KEY_HEADS_JSON} ranks only {len(keys.mlps)} MLPs")
    d_model, parallel, name = model_shape(cfg, identify)
    heads = [(h.layer, h.head) for h in keys.heads_ranked]
    mlps = [m.layer for m in keys.mlps[:cfg.mlps]]
    extra = {k: v for k, v in effects.to_json().items() if k not in ("heads", "mlps")}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / CIRCUIT_JSON, circuits.graph_json(effects.heads, effects.mlps, heads, mlps, d_model, parallel,
                                                       keyheads=extra))
    write_json(out / HOOKS_JSON, circuits.hooks_json(heads, mlps))
    print(f"{len(heads)} key heads and {len(mlps)} MLPs of {identify} (d_model {d_model}"
          f"{', parallel attention and MLP' if parallel else ''}{f', from {name}' if name else ''}):\n"
          f"  {out / CIRCUIT_JSON}  MIB / EAP-IG graph, node scores = effects\n"
          f"  {out / HOOKS_JSON}  TransformerLens hook names")
    return 0


def register(sub) -> None:
    p = sub.add_parser("export", help="key heads and effects as a MIB / EAP-IG circuit graph and TransformerLens "
                       "hook names")
    add_settings(p, ExportCommand)
    p.set_defaults(func=cmd_export)
