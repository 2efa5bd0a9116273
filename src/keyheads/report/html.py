"""report.html: one self-contained page for a run folder (figures inline, no network, no model).

    from keyheads.report.html import write_html_report
    write_html_report("runs/demo")          # -> runs/demo/report.html

The page only reads what the stages wrote; sections follow the paper's order (figures 2-6, with the sets
identified apart after figure 2's, tables 1-2), then the findings and the manifest.
"""
from __future__ import annotations

from pathlib import Path

from ..data.settings import PairSettings
from ..data.templates import TASKS
from ..errors import MissingFile, UserError
from ..io import atomic_write_text
from ..results.run import SavedConfig, SavedData
from ..runfolder import RunFolder
from . import sections, tables
from .findings import VERDICTS, Finding, findings
from .manifest import manifest
from .markup import ENV, pct, signed_pct
from .rules import RULE
from .sections import heads_text

CONTENTS = (("identify", "Effects heatmap and key heads"), ("identify-sets", "Key heads set by set"),
            ("knockout", "Knockout curves"),
            ("transfer", "Transfer and cases"), ("attention", "Attention by role"), ("mlp", "MLPs"),
            ("improve", "Tables 1 and 2"), ("findings", "Findings"), ("manifest", "Manifest"))


def _facts(run: RunFolder, items: list[Finding]) -> list[str]:
    """The page's opening lines: the data, the key heads, the knockout, the claims."""
    keys = run.key_heads_record
    ko = run.knockout_record
    pairs = run.pairs
    n_pairs = sum(1 for line in open(pairs, encoding="utf-8") if line.strip()) if pairs.is_file() else None
    facts = [f"{n_pairs} reference/counterfactual pairs" if n_pairs is not None else "no pairs.jsonl"]
    if keys is not None:
        facts.append(f"{len(keys.heads)} key heads of {keys.n_heads_total}: " + heads_text(keys.heads_ranked[:12]))
    if ko is not None:
        k = ko.key_heads
        facts.append(f"knocking them out ({ko.mean} mean): accuracy {pct(k.accuracy_before)} → "
                     f"{pct(k.accuracy_after)} "
                     f"({signed_pct(k.relative_change)})")
    verdicts = [f.verdict for f in items]
    facts.append("claims: " + ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if v in verdicts))
    return facts


def task_of(config: SavedConfig | None) -> tuple[str, bool]:
    """(the run's task as its config names it, whether it is arithmetic): a run of another task (answer-slot
    templates: IOI, ...) is reported in its own words and skips the claims about arithmetic."""
    data = config.data if config is not None and config.data is not None else SavedData()
    task = data.task
    try:
        arithmetic = PairSettings.model_validate(data.to_json()).arithmetic
    except (ValueError, UserError):  # a config this release cannot read: as it reads
        arithmetic = all(t in TASKS for t in task.split(","))
    return task, arithmetic


def render(folder: str | Path) -> str:
    """The whole page as a string (nothing written), from templates/page.html.j2."""
    run = RunFolder.of(folder)
    config = run.config_record  # the effective settings, as given
    task, arithmetic = task_of(config)
    every = findings(run)
    items = every if arithmetic else [f for f in every if not RULE[f.row].arithmetic]
    skipped = [] if arithmetic else [f for f in every if RULE[f.row].arithmetic]
    model = config.model if config is not None else None
    sets = sections.identified_sets(run)  # empty unless the run identified on more sets (also_identify)
    parts = [sections.identify(run), sets, sections.knockout(run), sections.transfer(run), sections.attention(run),
             sections.mlp(run), tables.improve(run), tables.findings_section(items, skipped, task), manifest(run)]
    contents = [c for c in CONTENTS if sets or c[0] != "identify-sets"]
    return ENV.get_template("page.html.j2").render(run_name=run.root.name, model=model or run.root.name,
                                                   facts=_facts(run, items), contents=contents, parts=parts,
                                                   task=task, arithmetic=arithmetic)


def write_html_report(folder: str | Path) -> Path:
    """Write report.html into the run folder (atomically) from the files in it; returns its path."""
    run = RunFolder(folder)
    if not run.root.is_dir():
        raise MissingFile(f"run folder {run.root} does not exist")
    return atomic_write_text(run.report, render(folder))

