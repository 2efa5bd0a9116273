"""Which method finds the circuit? Path patching, activation patching, attribution patching and its integrated-
gradients variant, on circuits known in advance and on real models' tasks, into one record and one page:

    python -m studies.compare_methods measure compiled            # the 5 compiled programs (seconds)
    python -m studies.compare_methods measure smollm2-135m        # arithmetic and IOI on a bundled model
    python -m studies.compare_methods measure qwen2.5-coder-0.5b \
        --arithmetic records/table1-qwen0.5b/cells/identify/run/pairs.jsonl
    python -m studies.compare_methods page                        # record -> studies/compare_methods.md

Each part is written into records/compare-methods/record.json (the other parts are kept), with the commit and
command that made it; a model's part is written after each method of each task, and a re-run keeps the methods the
record holds whole (END curves included) for the same pairs (with its commit and the forward pass timed in its own
process), so that the measurement (hours on a 0.5B model on two cores) can go on across sessions. The page is
generated from the record alone; a method not measured yet is said so.

- Compiled programs (tests/fixtures/compiled): each method's heads ranked by |effect|; its top-k (k = the heads on
  the output's path, heads with |effect| < 1e-6 left out) against the on-path heads: precision and recall.
- Real models: each method's effects on the task's pairs (the first `--pairs` of them) rank the heads and MLPs;
  MIB's faithfulness of the circuits of its top components (keyheads faithfulness: counterfactual patching of
  everything outside, the answer logit, |score| first) gives CPR and CMD.
- Time: each method's seconds over the pairs, as a ratio to one forward pass over the same pairs in the same
  batches, measured in the same process one after the other (take no timing beside another job).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from keyheads.circuits import head_node, mlp_node
from keyheads.data.pairs import write_pairs
from keyheads.data.settings import PairSettings
from keyheads.faithfulness.curve import PERCENTAGES
from keyheads.faithfulness.run import faithfulness
from keyheads.io import atomic_write_text, file_sha256, read_json, write_json
from keyheads.models import load_model
from keyheads.models.model import HookedModel
from keyheads.patching import IdentifySettings, run_sweep
from keyheads.patching.samples import batches, load_patch_samples
from keyheads.provenance import code_commit

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "records" / "compare-methods" / "record.json"
PAGE = ROOT / "studies" / "compare_methods.md"
FIXTURES = ROOT / "tests" / "fixtures" / "compiled"
METHODS = ("path", "activation", "attribution", "attribution-ig")
ZERO = 1e-6


@torch.no_grad()
def forward_seconds(model: HookedModel, pairs: Path, batch_size: int) -> float:
    """One forward pass over the pairs' reference prompts, in the sweep's batches."""
    samples = load_patch_samples(model, pairs)
    start = time.perf_counter()
    for batch in batches(samples, batch_size, model.device, model.tokenizer.pad_token_id or 0):
        model.hf(input_ids=batch.ref, use_cache=False, **batch.inputs())
    return time.perf_counter() - start


def timed_effects(model: HookedModel, pairs: Path, method: str, batch_size: int):
    start = time.perf_counter()
    effects, _ = run_sweep(model, pairs, IdentifySettings(method=method), batch_size=batch_size, progress=False)
    return effects, time.perf_counter() - start


def measure_compiled() -> dict:
    out = {}
    for folder in sorted(p for p in FIXTURES.iterdir() if (p / "ground_truth.json").is_file()):
        truth = read_json(folder / "ground_truth.json")
        on_path = sorted(f"{h['layer']}.{h['head']}" for h in truth["heads"] if h["on_path"])
        model = load_model(str(folder), device="cpu", dtype="float32")
        pairs = folder / "pairs.jsonl"
        forward_seconds(model, pairs, 128)  # warm-up: the first pass pays for allocation
        base = forward_seconds(model, pairs, 128)
        row = {"on_path": on_path, "forward_seconds": base, "methods": {}}
        for method in METHODS:
            effects, seconds = timed_effects(model, pairs, method, 128)
            ranked = sorted(((abs(v), f"{l}.{h}") for l, r in enumerate(effects.heads) for h, v in enumerate(r)
                             if abs(v) >= ZERO), key=lambda t: -t[0])
            top = [name for _, name in ranked[:len(on_path)]]
            hit = len(set(top) & set(on_path))
            row["methods"][method] = {"top": top, "precision": hit / len(top) if top else None,
                                      "recall": hit / len(on_path), "seconds": seconds, "ratio": seconds / base,
                                      "effects": effects.heads}
        out[folder.name] = row
    return out


def ioi_pairs(model: HookedModel, n: int, dest: Path) -> Path:
    from keyheads.data.generate import pairs_for  # noqa: PLC0415

    settings = PairSettings(template_files=[str(ROOT / "configs" / "ioi-templates.yaml")], task="ioi", n=n,
                            keep_correct=True, single_token_answer=True)
    return write_pairs(dest, pairs_for(model, settings, progress=False))


def measure_task(model: HookedModel, pairs: Path, n: int, batch_size: int, work: Path, done: dict | None,
                 keep: Callable[[dict], None]) -> dict:
    """Each method's effects, time and faithfulness curves on the task's first `n` pairs. A method `done` holds
    for the same pairs is kept; each method is handed to `keep` as it finishes, so that a run stopped after
    some methods (about 10 minutes each on a 0.5B model on two cores) loses none of them."""
    rows = [line for line in pairs.read_text().splitlines() if line.strip()][:n]
    mine = work / f"{pairs.stem}-{n}.jsonl"
    mine.write_text("".join(r + "\n" for r in rows))
    out = {"pairs": relative(pairs), "pairs_sha256": file_sha256(pairs), "n": len(rows), "methods": {}}
    if done is not None and (done["pairs_sha256"], done["n"]) == (out["pairs_sha256"], out["n"]):
        out["methods"] = dict(done["methods"])
        out["forward_seconds"] = done["forward_seconds"]
    base = None
    for method in METHODS:
        if "end" in out["methods"].get(method, {}):
            print(f"  {method}: in the record already", flush=True)
            continue  # a method measured before the END curves existed is measured again, whole
        if base is None:  # the ratio's denominator, measured in the process that times the method
            forward_seconds(model, mine, batch_size)  # warm-up
            base = forward_seconds(model, mine, batch_size)
        effects, seconds = timed_effects(model, mine, method, batch_size)
        scores = {head_node(l, h): -v for l, r in enumerate(effects.heads) for h, v in enumerate(r)}
        scores.update({mlp_node(l): -v for l, v in enumerate(effects.mlps)})
        curve = faithfulness(model, mine, scores, batch_size=batch_size, progress=False)
        # the same circuits ablated at END only, where the four methods measure the effects that rank them
        end = faithfulness(model, mine, scores, batch_size=batch_size, progress=False, positions="end")
        out["methods"][method] = {"seconds": seconds, "forward_seconds": base, "ratio": seconds / base,
                                  "cpr": curve.cpr, "cmd": curve.cmd, "f": curve.f, "sizes": curve.sizes,
                                  "top": curve.circuits[-1][:10], "m_full": curve.m_full, "m_empty": curve.m_empty,
                                  "end": {"cpr": end.cpr, "cmd": end.cmd, "f": end.f},
                                  "commit": code_commit()}
        out["forward_seconds"] = base
        keep(out)
        print(f"  {method}: {seconds:.1f} s ({seconds / base:.1f} forwards), CPR {curve.cpr:.3f}, CMD {curve.cmd:.3f}"
              f"; at END: CPR {end.cpr:.3f}, CMD {end.cmd:.3f}", flush=True)
    return out


def relative(path: Path) -> str:
    """A path as the record keeps it: relative to the repository when inside it, so that no machine's folder is
    written into a committed record."""
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def save(part: str, result: dict) -> None:
    record = read_json(RECORD) if RECORD.is_file() else {"parts": {}}
    command = "python -m studies.compare_methods " + " ".join(sys.argv[1:])
    record["parts"][part] = {"commit": code_commit(), "command": command,
                             "threads": torch.get_num_threads(), **result}
    write_json(RECORD, record)


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def page(record: dict) -> str:
    parts = record["parts"]
    lines = ["# Which method finds the circuit?", "",
             "Written by `python -m studies.compare_methods page` from `records/compare-methods/record.json`, which "
             "`python -m studies.compare_methods measure PART` computes (its docstring says how); nothing below is "
             "typed by hand. Methods: exact path patching (the paper's Algorithm 1, receivers the logits), activation "
             "patching (total effect), attribution patching (one gradient) and attribution-ig (its integrated-"
             "gradients variant, 5 steps: EAP-IG's idea at node level).", ""]
    if "compiled" in parts:
        c = parts["compiled"]
        lines += ["## Circuits known in advance", "",
                  "Each method's top-k heads by |effect| (k = the heads on the output's path; |effect| < 1e-6 left "
                  "out) against the heads tracr placed on the output's path: precision / recall. Time: seconds over "
                  "the program's pairs as a ratio to one forward pass over them.", "",
                  "| program | on path | " + " | ".join(f"{m} top-k | P / R | time" for m in METHODS) + " |",
                  "|---|---|" + "---|---|---|" * len(METHODS)]
        for name, row in c["programs"].items():
            cells = []
            for m in METHODS:
                r = row["methods"][m]
                cells += [", ".join(r["top"]) or "none", f"{pct(r['precision'])} / {pct(r['recall'])}",
                          f"{r['ratio']:.1f}x"]
            lines.append(f"| {name} | {', '.join(row['on_path'])} | " + " | ".join(cells) + " |")
        misses = [(name, m) for name, row in c["programs"].items() for m in METHODS
                  if row["methods"][m]["recall"] < 1]
        silent = [(name, m) for name, row in c["programs"].items() for m in METHODS
                  if not row["methods"][m]["top"]]
        lines += ["", "Where a method misses an on-path head: " + (
            "; ".join(f"{m} on {name}" for name, m in misses) if misses else "nowhere") + ". Where it finds no head "
            "at all (every |effect| below 1e-6): " + ("; ".join(f"{m} on {name}" for name, m in silent) or "nowhere")
            + ". Path patching with the logits as receivers freezes every later head, so a head that acts only "
            "through a later head's query (countfirst's first head) has no path effect by design. The gradient "
            "methods estimate that same frozen quantity at END from a derivative. A likely reason for their "
            "misses, not tested here: in count and countfirst the head's output reaches the answer through the MLP "
            "tracr compiles for SelectorWidth, a lookup of steps whose derivative is zero almost everywhere, so a "
            "derivative sees nothing where a patch changes the answer (the record holds every method's effects).", "",
            f"Measured at {c['commit']}, {c['threads']} thread(s): `{c['command']}`.", ""]
    models = [k for k in parts if k != "compiled"]
    if models:
        lines += ["## Real models: MIB's faithfulness of each method's circuits", "",
                  "Each method's effects on the task's pairs rank the heads and MLPs by |effect|; the circuits of "
                  "the top 0.1% ... 100% of them are scored with MIB's node-level faithfulness (`keyheads "
                  "faithfulness`: everything outside patched from the counterfactual, the answer logit). CPR: area "
                  "under f (higher is better); CMD: area between f and 1 (lower is better). All: everything outside "
                  "ablated at every position, as MIB does; END: at the last position only, where the four methods "
                  "measure the effects that rank the components (- where the record has no END curve).", "",
                  "| model | task | pairs | " + " | ".join(f"{m} CPR / CMD, all | END | time" for m in METHODS) + " |",
                  "|---|---|---|" + "---|---|---|" * len(METHODS)]
        for name in models:
            for task, r in parts[name]["tasks"].items():
                cells = []
                for m in METHODS:
                    if m not in r["methods"]:  # a part measured method by method, not finished yet
                        cells += ["not measured yet", "-", "-"]
                        continue
                    v = r["methods"][m]
                    end = f"{v['end']['cpr']:.3f} / {v['end']['cmd']:.3f}" if "end" in v else "-"
                    cells += [f"{v['cpr']:.3f} / {v['cmd']:.3f}", end, f"{v['ratio']:.1f}x"]
                lines.append(f"| {name} | {task} | {r['n']} | " + " | ".join(cells) + " |")
        lines += ["", "Faithfulness at each circuit size (f, all positions; the sizes are MIB's percentages of the "
                  "scored components):", "",
                  "| model | task | method | " + " | ".join(f"{100 * p:g}%" for p in PERCENTAGES) + " |",
                  "|---|---|---|" + "---|" * len(PERCENTAGES)]
        for name in models:
            for task, r in parts[name]["tasks"].items():
                for m in METHODS:
                    if m in r["methods"]:
                        lines.append(f"| {name} | {task} | {m} | "
                                     + " | ".join(f"{x:.3f}" for x in r["methods"][m]["f"]) + " |")
        ends = [(name, task, m, v["end"]) for name in models for task, r in parts[name]["tasks"].items()
                for m, v in r["methods"].items() if "end" in v]
        if ends:
            lines += ["", "The same circuits with everything outside them ablated at END only (f):", "",
                      "| model | task | method | " + " | ".join(f"{100 * p:g}%" for p in PERCENTAGES) + " |",
                      "|---|---|---|" + "---|" * len(PERCENTAGES)]
            lines += [f"| {name} | {task} | {m} | " + " | ".join(f"{x:.3f}" for x in end["f"]) + " |"
                      for name, task, m, end in ends]
            lines += ["", _where_faithful(ends, PERCENTAGES)]
        below = [x for name in models for r in parts[name]["tasks"].values() for v in r["methods"].values()
                 for x in v["f"][:-1]]
        if below and max(below) < 0.1:
            lines += ["", "Below 100% no circuit of any method reaches f = 0.1 here (the largest is "
                      f"{max(below):.3f}): with everything outside it carrying the counterfactual at every "
                      "position, no circuit of up to half the heads and MLPs, ranked by any of the four methods, "
                      "restores the answer's logit."]
        lines += [""] + [f"{name}: measured at {parts[name]['commit']}, {parts[name]['threads']} threads: "
                         f"`{parts[name]['command']}`." for name in models] + [""]
    return "\n".join(lines)


def _where_faithful(ends: list[tuple[str, str, str, dict]], percentages: tuple[float, ...]) -> str:
    """A sentence from the END curves: for each method and task, the smallest circuits that reach f >= 0.5 and
    f >= 0.8."""
    def smallest(f: list[float], at: float) -> str:
        reached = [p for p, x in zip(percentages, f) if x >= at]
        return f"{100 * reached[0]:g}%" if reached else "none"

    parts = [f"{m} on {name} {task}: {smallest(end['f'], 0.5)} / {smallest(end['f'], 0.8)}"
             for name, task, m, end in ends]
    return ("Ablated at END only, the smallest circuits that keep f >= 0.5 / f >= 0.8 (shares of the scored "
            "components): "
            + "; ".join(parts) + ". At END the methods rank the components by the very quantity that is ablated. A "
            "likely reason why the two readings differ, not measured in this record: at every position an early "
            "component that writes the prompt's tokens (an MLP of the first layer), which an END-only effect ranks "
            "low, carries the counterfactual into every later layer.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    m = sub.add_parser("measure", help="measure one part into the record")
    m.add_argument("part", help="'compiled', or a bundled model's name")
    m.add_argument("--arithmetic", help="the arithmetic pairs (default: the SmolLM2 rates study's identify pairs)",
                   default=str(ROOT / "records/table1-smollm2-rates/cells/identify/run/pairs.jsonl"))
    m.add_argument("--pairs", type=int, default=60, help="pairs per task")
    m.add_argument("--batch-size", type=int, default=16)
    m.add_argument("--threads", type=int, default=2)
    sub.add_parser("page", help="write the page from the record")
    args = parser.parse_args(argv)
    if args.action == "page":
        atomic_write_text(PAGE, page(read_json(RECORD)))
        print(f"wrote {PAGE}")
        return 0
    torch.set_num_threads(args.threads)
    if args.part == "compiled":
        torch.set_num_threads(1)  # matrices a few dozen wide (tests/compiled/conftest.py)
        save("compiled", {"programs": measure_compiled()})
        return 0
    model = load_model(args.part, device="cpu")
    work = Path("runs/compare-methods") / args.part
    work.mkdir(parents=True, exist_ok=True)
    tasks = {"arithmetic": Path(args.arithmetic), "ioi": ioi_pairs(model, 2 * args.pairs, work / "ioi.jsonl")}
    before = read_json(RECORD)["parts"].get(args.part, {}) if RECORD.is_file() else {}
    result = dict(before.get("tasks", {}))
    for task, pairs in tasks.items():
        print(f"{args.part} {task}", flush=True)

        def keep(partial: dict, task: str = task) -> None:
            result[task] = partial
            save(args.part, {"model": args.part, "tasks": result})

        result[task] = measure_task(model, pairs, args.pairs, args.batch_size, work, result.get(task), keep)
    save(args.part, {"model": args.part, "tasks": result})
    print(json.dumps({t: {m: round(v["cpr"], 3) for m, v in r["methods"].items()} for t, r in result.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
