"""The identify step: sweep, then write effects.json, effects.csv, key_heads.json and the heatmap.

The module is not named `identify`: keyheads.patching gives the function `identify` on first use, and a submodule
of that name, once imported, would take the function's place in the package."""
from __future__ import annotations

from pathlib import Path

from .. import distributed
from ..components import rule_text
from ..heads import Head
from ..io import write_json
from ..models.model import HookedModel
from ..results.identify import Identification, KeyHeads
from ..runfolder import EFFECTS_JSON, KEY_HEADS_JSON
from .heatmap import draw_heatmap
from .settings import IdentifySettings
from .sweep import run_sweep


def identify(model: HookedModel, data: str | Path, config: IdentifySettings, out: str | Path, *, batch_size: int = 16,
             progress: bool = True) -> Identification:
    """Run the sweep into `out` (resuming a checkpoint there) and write every output.

    Key heads: below config.threshold and at most config.top_k; top_k alone means the K most
    negative, and with neither the paper's -5% applies.
    Under several processes every rank calls it and gets the same result; only the main
    one writes, and all return once the files are there.
    """
    out = Path(out)
    effects, state = run_sweep(model, data, config, out=out, batch_size=batch_size, progress=progress)
    chosen = KeyHeads.chosen(effects, threshold=config.threshold, top_k=config.top_k)
    main = distributed.is_main()
    if main:
        effects.write(out / EFFECTS_JSON)
        write_json(out / KEY_HEADS_JSON, chosen.to_json())  # no timing inside: the same inputs give the same bytes
        draw_heatmap(effects, out / "heatmap.png", key=chosen.heads_ranked)
    rho = None
    if config.method in ("attribution", "attribution-ig"):  # how far the estimate is from the exact effects
        exact, _ = run_sweep(model, data, config.model_copy(update={"method": "path"}), out=None,
                             batch_size=batch_size, progress=progress)
        from scipy.stats import spearmanr  # noqa: PLC0415 -- loaded on use, see pyproject

        rho = float(spearmanr(sum(effects.heads, []), sum(exact.heads, [])).statistic)
        if main:
            write_json(out / "attribution_vs_path.json", {"spearman_heads": rho})
    distributed.barrier()  # a later stage on any rank may read these files
    return Identification(effects, chosen, seconds=state["seconds"], spearman_vs_path=rho)


def describe(found: Identification) -> str:
    """What `keyheads identify` prints."""
    effects, chosen = found.effects, found.key_heads
    pct = effects.metric == "relative-logit"
    fmt = (lambda v: f"{v:+.1%}") if pct else (lambda v: f"{v:+.3g}")
    lines = [f"{effects.method} patching, metric {effects.metric}: {effects.n_samples} samples "
             f"({effects.n_excluded} excluded), {found.seconds or 0.0:.1f} s"]
    shown = ", ".join(f"{Head(k.layer, k.head)} ({fmt(k.effect)})" for k in chosen.heads[:15])
    lines.append(f"key heads ({len(chosen.heads)} of {chosen.n_heads_total}; "
                 f"{rule_text(chosen.threshold, chosen.top_k)}): {shown or 'none'}")
    if not chosen.heads:
        best = KeyHeads.chosen(effects, threshold=None, top_k=3).heads
        lines.append("no head passed the threshold; the most negative are "
                     + ", ".join(f"{k.label} ({fmt(k.effect)})" for k in best)
                     + ". Small models spread the work thinly: pick key heads with --top-k K")
    if found.spearman_vs_path is not None:
        lines.append(f"attribution vs exact path patching: Spearman rank correlation over heads = "
                     f"{found.spearman_vs_path:.3f}")
    return "\n".join(lines)
