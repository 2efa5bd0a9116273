"""report.html: one self-contained page for a run folder (figures inline, no network, no model).

    from keyheads.report.html import write_html_report
    write_html_report("runs/demo")          # -> runs/demo/report.html

The page only reads what the stages wrote; sections follow the paper's order (figures 2-6,
tables 1-2), then the findings and the manifest.
"""
from __future__ import annotations

from pathlib import Path

from ..io import atomic_write_text
from . import sections, tables
from .findings import findings
from .manifest import manifest
from .markup import esc, pct, read_json, signed_pct

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:1.2em 2em 4em}
h1{margin:.2em 0 .1em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2.2em}
nav ol{columns:2;font-size:.92em}a{color:#0b61a4}
figure{margin:1em 0;background:#fff;border:1px solid #e3e3e3;padding:.5em;display:inline-block;max-width:100%}
figure img{max-width:100%;height:auto;display:block}figcaption{font-size:.8em;color:#777}
table{border-collapse:collapse;margin:.6em 0 1.2em;background:#fff;font-size:.88em}
th,td{border:1px solid #ddd;padding:.25em .55em;text-align:left;vertical-align:top}
th{background:#f0f0f0;cursor:pointer;user-select:none;white-space:nowrap}th.asc:after{content:" ▲"}th.desc:after{content:" ▼"}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tbody tr:nth-child(even){background:#f8f8f8}
.note{color:#555}.missing{color:#a15c00;font-style:italic}.headline{font-weight:600}
pre{background:#f4f4f4;padding:.5em;white-space:pre-wrap;font-size:.85em;max-height:14em;overflow:auto}
.case{margin:.8em 0 1.4em}.label.operand{color:#c0392b;font-weight:600}.label.operator{color:#1e8449;font-weight:600}
ul.findings{list-style:none;padding:0}li.finding{background:#fff;border:1px solid #e3e3e3;border-left:6px solid #999;
padding:.5em .8em;margin:.5em 0}li.held{border-left-color:#2e7d32}li.failed{border-left-color:#c62828}
.badge{display:inline-block;font-size:.78em;padding:.05em .5em;border-radius:.8em;color:#fff;background:#888;margin-right:.4em}
.badge.held{background:#2e7d32}.badge.failed{background:#c62828}.evidence{color:#444;font-size:.92em}
svg.chart text{font-size:11px;fill:#333}.summary td{white-space:normal}
"""

# Click a header to sort by that column; numeric cells sort by their exact value (data-sort).
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (tbl) {
  var heads = tbl.querySelectorAll("thead th");
  heads.forEach(function (th, col) {
    th.addEventListener("click", function () {
      var asc = !th.classList.contains("asc");
      heads.forEach(function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(asc ? "asc" : "desc");
      var body = tbl.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var td = row.cells[col];
        if (!td) { return ""; }
        var v = td.getAttribute("data-sort");
        return v === null ? td.textContent : parseFloat(v);
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        var r = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
        return asc ? r : -r;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""

CONTENTS = (("identify", "Effects heatmap and key heads"), ("knockout", "Knockout curves"),
            ("transfer", "Transfer and cases"), ("attention", "Attention by role"), ("mlp", "MLPs"),
            ("improve", "Tables 1 and 2"), ("findings", "Findings"), ("manifest", "Manifest"))


def _summary(run: Path, items: list[dict]) -> str:
    config = read_json(run / "config.json") or {}
    keys = read_json(run / "identify" / "key_heads.json")
    ko = read_json(run / "knockout" / "knockout.json")
    pairs = run / "pairs.jsonl"
    n_pairs = sum(1 for line in open(pairs, encoding="utf-8") if line.strip()) if pairs.is_file() else None
    facts = [f"{n_pairs} reference/counterfactual pairs" if n_pairs is not None else "no pairs.jsonl"]
    if isinstance(keys, dict):
        facts.append(f"{len(keys.get('heads', []))} key heads of {keys.get('n_heads_total', '?')}: "
                     + ", ".join(k["label"] for k in keys.get("heads", [])[:12]))
    if isinstance(ko, dict) and ko.get("key_heads"):
        k = ko["key_heads"]
        facts.append(f"knocking them out: accuracy {pct(k.get('accuracy_before'))} → {pct(k.get('accuracy_after'))} "
                     f"({signed_pct(k.get('relative_change'))})")
    held = [f["held"] for f in items]
    facts.append(f"claims: {held.count(True)} held, {held.count(False)} not held, {held.count(None)} not tested")
    toc = "".join(f'<li><a href="#{a}">{esc(t)}</a></li>' for a, t in CONTENTS)
    model = config.get("model") if isinstance(config, dict) else None
    return (f"<header><h1>keyheads run: {esc(model or run.name)}</h1>"
            f'<p class="note">Run folder {esc(run.name)}. The arithmetic heads and MLPs of one model, identified, '
            "explained and fine-tuned as in “Interpreting and Improving Large Language Models in Arithmetic "
            "Calculation” (ICML 2024).</p>"
            f'<ul class="summary">{"".join(f"<li>{esc(f)}</li>" for f in facts)}</ul>'
            f"<nav><ol>{toc}</ol></nav></header>")


def render(run: str | Path) -> str:
    """The whole page as a string (nothing written)."""
    run = Path(run)
    items = findings(run)
    parts = [_summary(run, items), sections.identify(run), sections.knockout(run), sections.transfer(run),
             sections.attention(run), sections.mlp(run), tables.improve(run), tables.findings_section(items),
             manifest(run)]
    title = esc(f"keyheads report: {run.name}")
    # the empty data: icon keeps the browser from asking for /favicon.ico (a console error offline)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{title}</title><link rel=\"icon\" href=\"data:,\"><style>{CSS}</style></head>\n"
            "<body><main>\n" + "\n".join(parts) + f"\n</main><script>{SCRIPT}</script></body></html>\n")


def write_html_report(run: str | Path) -> Path:
    """Write run/report.html (atomically) from the files in the run folder; returns its path."""
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"run folder {run} does not exist")
    return atomic_write_text(run / "report.html", render(run))


if __name__ == "__main__":  # python -m keyheads.report.html RUN_FOLDER
    import sys

    for folder in sys.argv[1:] or ["runs/demo"]:
        print(write_html_report(folder))
