"""README's GPU cost paragraph and bench/RESULTS.md's phase C section, from the committed records of
bench/paper_gpu.py's runs (records/paper-llama2-7b-gpu): the figures gathered as data, then written as text.

    python -m bench.paper_gpu_records [--check] [--data-dir DATA]   (also: python -m bench.paper_gpu report-records)
    python -m bench.paper_gpu_records --readme FILE --results FILE     # write copies instead of the repository's
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.paper_gpu_setup import CONFIG, EVAL_ITEMS, ROOT, SHAPES, default_data_dir
from bench.results import read_section, write_section

if TYPE_CHECKING:
    from keyheads.planning.planner import Plan


RECORDS = ROOT / "records" / "paper-llama2-7b-gpu"
PHASE_C_TITLE = "The paper config's phase C and also_identify sets on one GPU (bench/paper_gpu.py)"
README = ROOT / "README.md"
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
# README's cost paragraph lies between these markers, written from the records (tests/test_gpu_cost_figures.py). A
# marker names the script's file, which tests/test_one_value.py checks exists; it runs as `python -m bench.paper_gpu`.
README_BEGIN = ("<!-- gpu cost: written by `python bench/paper_gpu.py report-records` from records/paper-llama2-7b-gpu "
                "-->")
README_END = "<!-- end of gpu cost -->"
# RESULTS' phase C section lies between these (tests/test_one_value.py reads no figure inside them as typed by hand)
RESULTS_BEGIN = ("<!-- gpu records: written by `python bench/paper_gpu.py report-records` from "
                 "records/paper-llama2-7b-gpu -->")
RESULTS_END = "<!-- end of gpu records -->"
LLAMA2_VOCAB = 32_000  # LLaMA-2's tokenizer; the records' model has SmolLM2's (see the module's docstring)
PLAN_GPUS = 8  # README's `keyheads plan --model PATH --gpus 8`: the config's one node of 8 GPUs


def shown(path: Path) -> str:
    """`path` as the pages name it: from the repository's root when it is inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Record:
    """One committed record: meta.json (the machine), record.json (commit and command), plan.json, stages.jsonl
    (every stage's time and memory) and the run folder's small outputs (run/)."""

    folder: Path
    meta: dict
    record: dict
    plan: dict
    rows: tuple[dict, ...]

    @classmethod
    def read(cls, folder: Path) -> Record:
        try:
            plan = json.loads((folder / "plan.json").read_text())
        except (OSError, ValueError):
            plan = {}
        rows = tuple(json.loads(x) for x in (folder / "stages.jsonl").read_text().splitlines() if x.strip())
        return cls(folder, json.loads((folder / "meta.json").read_text()),
                   json.loads((folder / "record.json").read_text()), plan, rows)

    @property
    def gpu(self) -> str:
        return self.meta.get("gpu", "?")

    @property
    def commit(self) -> str:
        return self.record["commit"][:7]

    @property
    def run(self) -> Path:
        return self.folder / "run"


@dataclass(frozen=True)
class Trained:
    """One variant's fine-tuning in a record: run/finetune/VARIANT/finetune.json and its stage's row."""

    record: str
    gpu: str
    variant: str
    parallel: str               # the mode it trained in (fsdp: FSDP2)
    steps: int                  # the optimizer steps timed
    samples: int                # the samples those steps held
    samples_per_second: float
    first: bool                 # the first variant its run trained: its step carries the run's warm-up
    allocated_peak: int | None  # torch's peak during the stage (stages.jsonl)
    micro_batch: int
    run_samples: float          # what the config trains: the training set's samples times the epochs
    data_n: int
    epochs: float

    @property
    def minutes(self) -> float:
        """The config's whole training at this speed, on the record's one GPU."""
        return self.run_samples / self.samples_per_second / 60


@dataclass(frozen=True)
class BenchmarkCost:
    """One benchmark of the evaluation, extrapolated from the rows timed on one GPU model to its whole set."""

    benchmark: str
    full: int               # items in the whole evaluated set
    rows: int               # rows timed
    items: int              # items a row
    seconds: float          # a row's time for its items (the mean over the rows)
    cap: int | None         # new tokens measured (None: choices scored, no generation)
    at_cap: float           # seconds for the whole set and every row of the table, at the cap measured
    at_config: float        # the same with the generation scaled linearly to the config's cap


@dataclass(frozen=True)
class EvalCost:
    gpu: str
    rows: int  # the table's rows: base, knockout and each of the config's variants
    benchmarks: tuple[BenchmarkCost, ...]

    @property
    def hours_at_cap(self) -> float:
        return sum(b.at_cap for b in self.benchmarks) / 3600

    @property
    def hours_at_config(self) -> float:
        return sum(b.at_config for b in self.benchmarks) / 3600

    @property
    def items(self) -> int:
        return sum(b.full for b in self.benchmarks)


@dataclass(frozen=True)
class Figures:
    """Every figure README's cost paragraph and RESULTS' phase C section state, from the records (and, for the
    memory of the config's 8 GPUs, which no record measured, from the planner as `keyheads plan` calls it)."""

    records: tuple[Record, ...]
    variants: tuple[str, ...]       # the config's
    parallel: str                   # the config's training mode
    trained: tuple[Trained, ...]
    evaluated: dict[str, tuple[str, ...]]  # record folder -> the evaluation rows it holds
    evals: tuple[EvalCost, ...]     # one per GPU model
    plan: Plan                      # the planner's, for the config's model and machine
    plan_command: str

    @property
    def unevaluated(self) -> list[str]:
        done = {row for rows in self.evaluated.values() for row in rows}
        return [v for v in self.variants if v not in done]

    @property
    def untrained(self) -> list[str]:
        done = {t.variant for t in self.trained if t.parallel == self.parallel}
        return [v for v in self.variants if v not in done]


def eval_timings(run_folder: Path) -> dict[str, dict[str, tuple[int, float, int | None]]]:
    """row folder -> benchmark -> (items computed, seconds, max_new_tokens or None), from the eval stage's
    per-benchmark summaries (read as their type)."""
    from keyheads.results.evaluation import BenchmarkSummary
    from keyheads.runfolder import read_result

    out: dict[str, dict[str, tuple[int, float, int | None]]] = {}
    for path in sorted((run_folder / "eval").glob("*/*.json")):
        if path.name == "summary.json":  # the row's summaries together
            continue
        summary = read_result(path, BenchmarkSummary.from_json)
        if summary is not None and summary.timing:
            t = summary.timing
            out.setdefault(path.parent.name, {})[path.stem] = (int(t["computed"]), t["seconds"], summary.max_new_tokens)
    return out


@functools.cache
def full_size(benchmark: str, data_dir: Path) -> int:
    """Items in the benchmark's whole evaluated set; an MMLU category (mmlu-humanities, ...) is MMLU's questions
    of its subjects."""
    from keyheads.data.benchmarks import load
    from keyheads.evaluation.mmlu_subjects import CATEGORIES, subjects_of

    if benchmark in CATEGORIES:
        subjects = subjects_of(benchmark)
        return sum(r.subject in subjects for r in load("mmlu", data_dir=data_dir))
    return len(load(benchmark, data_dir=data_dir))


def trained(rec: Record) -> list[Trained]:
    """The fine-tuning runs a record holds, each with its speed and its stage's row."""
    from keyheads.runfolder import RunFolder

    rows = {r["stage"]: r for r in rec.rows}  # a stage's last row: the one whose outputs the run folder holds
    first: dict[str, str] = {}  # phase -> the first fine-tuning stage its run ran
    for r in rec.rows:
        if r["stage"].startswith("finetune/"):
            first.setdefault(r["phase"], r["stage"])
    out = []
    for variant, info in RunFolder(rec.run).finetune_records.items():
        row = rows.get(f"finetune/{variant}")
        t, epochs, micro = info.train, info.config.epochs, info.config.micro_batch_size
        if epochs is None or micro is None:
            raise ValueError(f"{rec.run}: finetune/{variant}'s finetune.json saves no epochs or micro_batch_size")
        out.append(Trained(rec.folder.name, rec.gpu, variant, t.parallel, t.steps_this_run, t.samples_this_run,
                           t.samples_per_second, row is not None and first.get(row["phase"]) == row["stage"],
                           row["allocated_peak"] if row else None, micro,
                           info.data.n * epochs, info.data.n, epochs))
    return out


def row_name(row) -> str:
    """An evaluation row as the config names it: base, knockout, or the variant whose adapter it evaluated."""
    spec = row.info.variant
    if spec is None:
        return row.label
    return Path(spec.model).name if spec.kind == "adapter" else "base" if spec.kind == "model" else spec.kind


def evaluated_rows(run: Path) -> tuple[str, ...]:
    from keyheads.runfolder import RunFolder

    results = RunFolder(run).eval_record
    return tuple(row_name(v) for v in results.variants) if results is not None else ()


def eval_costs(records: tuple[Record, ...], data_dir: Path, n_rows: int) -> tuple[EvalCost, ...]:
    """The evaluation: seconds an item at the measured cap, times the full sets, for the table's rows; one
    EvalCost per GPU model, since an H100's times are not an H200's."""
    from keyheads.evaluation.settings import DEFAULT_NEW_TOKENS

    timed: dict[str, dict[str, dict]] = {}
    for rec in records:
        timed.setdefault(rec.gpu, {}).update(
            {f"{rec.folder.name}/{row}": b for row, b in eval_timings(rec.run).items()})
    out = []
    for gpu, by_row in timed.items():
        costs = []
        for b in sorted({b for rows in by_row.values() for b in rows}):
            cells = [rows[b] for rows in by_row.values() if b in rows]
            items, cap = cells[0][0], cells[0][2]
            per_item = sum(c[1] for c in cells) / len(cells) / items
            full = full_size(b, data_dir)
            at_cap = per_item * full * n_rows
            scale = (DEFAULT_NEW_TOKENS.get(b, cap) / cap) if cap else 1.0
            costs.append(BenchmarkCost(b, full, len(cells), items, per_item * items, cap, at_cap, at_cap * scale))
        if costs:
            out.append(EvalCost(gpu, n_rows, tuple(costs)))
    return tuple(out)


def planned_memory(micro_batch: int) -> tuple[Plan, str]:
    """`keyheads plan --model PATH --gpus 8` on LLaMA-2-7B's config (its own vocabulary, not the records'), with
    the config's micro-batch: the plan and the command that gives it."""
    import tempfile

    import transformers

    from keyheads.commands.plan import plan_from
    from keyheads.config.commands import PlanCommand

    command = f"keyheads plan --model PATH --gpus {PLAN_GPUS}"
    if micro_batch != PlanCommand.model_fields["micro_batch_size"].default:
        command += f" --micro-batch-size {micro_batch}"
    with tempfile.TemporaryDirectory() as tmp:
        config = transformers.LlamaConfig(**SHAPES["llama-2-7b"], vocab_size=LLAMA2_VOCAB)
        config.to_json_file(Path(tmp) / "config.json")
        return plan_from(PlanCommand(model=tmp, gpus=PLAN_GPUS, micro_batch_size=micro_batch)), command


def gather(folders: list[Path], data_dir: Path, config: Path = CONFIG) -> Figures:
    """The figures of the records in `folders`, for the config they ran."""
    from keyheads.config.run import RunSettings

    settings = RunSettings.from_yaml(config, data_dir=str(data_dir))
    records = tuple(Record.read(f) for f in folders)
    n_rows = 2 + len(settings.variants)  # table 1: base, knockout, and the config's variants
    plan, command = planned_memory(settings.finetune.micro_batch_size)
    return Figures(records, tuple(settings.variants), settings.finetune.parallel,
                   tuple(t for rec in records for t in trained(rec)),
                   {rec.folder.name: evaluated_rows(rec.run) for rec in records},
                   eval_costs(records, data_dir, n_rows), plan, command)


def record_folders(root: Path | None = None) -> list[Path]:
    return sorted(p for p in (root or RECORDS).iterdir() if (p / "record.json").is_file())


def report_records(folders: list[Path], data_dir: Path) -> str:
    """The RESULTS section of phase C from committed records (each a folder with meta.json, stages.jsonl,
    record.json and run/): stage times and memory, and the evaluation's time extrapolated to the full sets."""
    return results_body(gather(folders, data_dir))


def results_body(fig: Figures) -> str:
    from keyheads.evaluation.settings import DEFAULT_NEW_TOKENS

    gib = lambda b: "-" if b is None else f"{b / 2**30:.1f}"  # noqa: E731
    lines = []
    table = ["| record | phase | stage | seconds | peak allocated GiB | peak reserved GiB | device peak GiB (NVML) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for rec in fig.records:
        meta, record = rec.meta, rec.record
        table += [f"| {rec.folder.name} | {r['phase']} | {r['stage']} | {r['seconds']:.1f} | "
                  f"{gib(r['allocated_peak'])} | {gib(r['reserved_peak'])} | {gib(r['device_peak'])} |"
                  for r in rec.rows]
        phases = "; ".join(f"{k}: " + (v if isinstance(v, str) else f"{v['seconds']:.0f} s, " + (
            "finished" if v["rc"] == 0 else "cut at the time limit" if v["rc"] == "timed out" else f"exit {v['rc']}"))
            for k, v in meta["phases"].items())
        lines.append(f"- `{shown(rec.folder)}`: {rec.gpu}, torch {meta.get('torch', '?')}, "
                     f"transformers {meta.get('transformers', '?')}, commit {rec.commit}; model built in "
                     f"{meta['build_seconds']} s; phases {phases}. Command: `{record['command']}`")
    ext: list[str] = []
    for e in fig.evals:
        ext += [*([""] if ext else []), f"On the {e.gpu}:", "",
                "| benchmark | full set | rows timed | items a row | s a row (mean) | cap (tokens) "
                f"| full set, {e.rows} rows, at the cap measured | at the config's cap (x tokens) |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        ext += [f"| {c.benchmark} | {c.full:,} | {c.rows} | {c.items} | {c.seconds:.1f} | {c.cap or '-'} | "
                f"{c.at_cap / 3600:.2f} h | {c.at_config / 3600:.2f} h |" for c in e.benchmarks]
        ext.append(f"| all | | | | | | {e.hours_at_cap:.1f} h | {e.hours_at_config:.1f} h |")
    benches = {c.benchmark for e in fig.evals for c in e.benchmarks}
    return f"""{RESULTS_BEGIN}
Measured 2026-11-27, each record on one GPU (named in its line), on a randomly initialised
LLaMA-2-7B shape in bf16 (SmolLM2's tokenizer, as in "The paper config end to end on one GPU"),
`configs/paper-llama2-7b.yaml` under torchrun (one process, FSDP2). The records are committed: each folder
holds the run's meta, the planner's plan, every stage's time and memory (stages.jsonl) and the run folder's
small outputs (stage records, pairs, effects, key heads, the fine-tuning summaries with their loss, the
evaluation's per-benchmark summaries and per-item cache), without weights. Sizes cut by flags as in the
earlier section; phases C1, C2 and C2-eval evaluate {EVAL_ITEMS} items a benchmark (one batch of 32) instead
of 4, and run without the also_identify sets (phase D runs them).

{chr(10).join(lines)}

What ran: phase C1 (full SFT, then the evaluation of base, knockout and full SFT), phase D (the six
also_identify sets: every identify/NAME stage finished; the phase was cut while its run went on to the
stale later stages, which it does not select), phase C2's training (precise@8, @16, @48, @64) on the H200;
then on an H100, phase C2-eval (precise@8 and @64 trained again and evaluated beside base and knockout, MMLU's
humanities subset included) and phase K (the knockout, attention and MLP stages on the library code of
fa1e9bb). Not measured: the evaluation rows of precise@16 and @48 (the lease ended; each would take what the
other precise rows took) and the evaluation on an H200 of anything but C1's rows.

{chr(10).join(table)}

The evaluation stage, extrapolated to the config's whole sets. Per item: the mean over the rows timed of each
benchmark's own time (loading excluded) over its {EVAL_ITEMS} items, in one batch of 32. A random model never
emits its stop token, so every generated answer ran to the cap measured (64 new tokens); a real model stops
earlier, so these are upper bounds at that cap. The last column scales the generation sets linearly to the
config's caps ({', '.join(f'{k} {v}' for k, v in DEFAULT_NEW_TOKENS.items() if k in benches)} new tokens):
an estimate, not a measurement. MMLU and CSQA score choices, with no generation. The eval stage's own time
(stages.jsonl) is larger than the benchmarks' sum: it also loads each row's model (13 GB for full SFT).

{chr(10).join(ext)}

Command: `python -m bench.paper_gpu report-records` (here, from the committed records).
{RESULTS_END}"""


def short_gpu(name: str) -> str:
    """NVIDIA H100 80GB HBM3 -> H100."""
    words = name.removeprefix("NVIDIA ").split()
    return words[0] if words else name


def joined(items: list[str]) -> str:
    """a, b and c."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s")


def span(values: list[float]) -> str:
    """The range of `values` rounded to whole numbers: 20-24, or 25 when both ends round alike."""
    lo, hi = f"{min(values):.0f}", f"{max(values):.0f}"
    return lo if lo == hi else f"{lo}-{hi}"


MODE_NAMES = {"fsdp": "FSDP2", "ddp": "DDP"}


def gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


def memory_sentence(fig: Figures) -> str:
    """The planner's bytes a GPU for the config on its 8 GPUs: training in the config's mode, analyses on one GPU."""
    plan, w, m = fig.plan, fig.plan.workload, fig.plan.machine
    names = {"finetune precise": f"precise SFT ({w.heads} heads)", "finetune precise+mlp": f"precise SFT + {w.mlps} "
             "MLPs", "finetune lora": f"LoRA (rank {w.lora_rank})", "finetune full": "full SFT"}
    modes = {s.stage: {o.mode: o for o in s.options} for s in plan.stages}
    training = [(names[s], o[fig.parallel]) for s, o in modes.items() if s.startswith("finetune")]
    analyses = [(s, o["gpu"]) for s, o in modes.items() if not s.startswith("finetune")]
    misfits = [name for name, o in training + analyses if not o.fits]
    sizes = ", ".join(f"{name} {gib(o.memory.gpu)}" + (" GiB a GPU" if i == 0 else "")
                      for i, (name, o) in enumerate(training))
    ddp = [f"{names[s]} would need {gib(o['ddp'].memory.gpu)}" for s, o in modes.items()
           if "ddp" in o and not o["ddp"].fits and fig.parallel != "ddp"]
    fits = "every stage fits" if not misfits else f"not every stage fits ({joined(misfits)} does not)"
    low, high = min(o.memory.gpu for _, o in analyses), max(o.memory.gpu for _, o in analyses)
    return (f"Memory, as `{fig.plan_command}` estimates it ({w.seq_len} tokens a sample, micro-batch {w.micro_batch}): "
            f"{fits} one {m.gpu_bytes / 2**30:.0f} GiB GPU in the config's mode, training under "
            f"{MODE_NAMES.get(fig.parallel, fig.parallel)} over the {m.world} GPUs ({sizes}"
            + (f"; under DDP {joined(ddp)}" if ddp else "")
            + f") and each analysis on one GPU ({gib(low)}-{gib(high)} GiB).")


def training_sentences(fig: Figures) -> list[str]:
    """What the records measured of training in the config's mode: full SFT's peak on one GPU, each variant's
    speed, and the config's whole training at that speed."""
    vocab = sorted({rec.plan.get("shape", {}).get("vocab") for rec in fig.records} - {None})
    mode = MODE_NAMES.get(fig.parallel, fig.parallel)
    ts = [t for t in fig.trained if t.parallel == fig.parallel]
    peaks = [f"on one {short_gpu(t.gpu)} full SFT allocated {gib(t.allocated_peak)} GiB at its peak (micro-batch "
             f"{t.micro_batch})" for t in ts if t.variant == "full" and t.allocated_peak]
    out = ["Measured at cut sizes with random weights of LLaMA-2-7B's shape"
           + (f" (vocabulary {joined([f'{v:,}' for v in vocab])}: SmolLM2's tokenizer)" if vocab else "")
           + f", one process under {mode} (`{shown(fig.records[0].folder.parent)}`)"
           + (": " + "; ".join(peaks) + "." if peaks else ".")]
    order = {v: i for i, v in enumerate(fig.variants)}
    by_gpu: dict[str, list[Trained]] = {}
    for t in sorted(ts, key=lambda t: order.get(t.variant, len(order))):
        by_gpu.setdefault(short_gpu(t.gpu), []).append(t)
    speeds: list[str] = []
    for gpu, g in by_gpu.items():
        cells: list[str] = []
        for t in g:
            unit = "" if speeds or cells else " samples/s"  # after the first figure only
            name = "full SFT" if t.variant == "full" else t.variant
            cells.append(f"{name} {t.samples_per_second:.1f}{unit}" + (" (first)" if t.first else ""))
        speeds.append(f"on the {gpu} " + ", ".join(cells))
    steps = joined([f"{'one' if n == 1 else n} optimizer step{'s' if n > 1 else ''} of {samples} samples"
                    for n, samples in sorted({(t.steps, t.samples) for t in ts})])
    if speeds:
        out.append(f"Training speed in the config's mode, from {steps}: " + "; ".join(speeds)
                   + " (first: the first variant its run trained, whose step carries the run's warm-up).")
    minutes = []
    for gpu, g in by_gpu.items():
        full = [t for t in g if t.variant == "full"]
        precise = [t.minutes for t in g if t.variant.startswith("precise") and not t.first]
        parts = []
        if full:
            first = " (first)" if all(t.first for t in full) else ""
            parts.append(f"{span([t.minutes for t in full])} minutes for full SFT{first}")
        if precise:
            parts.append(f"{span(precise)}{'' if full else ' minutes'} for each precise variant not marked first")
        minutes += [f"on the {gpu}, about " + " and ".join(parts)] if parts else []
    runs = {(t.run_samples, t.data_n, t.epochs) for t in ts}
    if len(runs) == 1 and minutes:
        [(total, n, epochs)] = runs
        out.append(f"For the config's {total:,.0f} samples ({n:,} x {epochs:g} epochs) that is, on one GPU: "
                   + "; ".join(minutes) + ".")
    if fig.untrained:
        out.append(f"Not trained on this config in this mode: {joined(fig.untrained)}.")
    return out


def evaluation_sentence(fig: Figures) -> str:
    """The evaluation's GPU-hours for the config's table on each GPU model, as RESULTS extrapolates them."""
    from keyheads.evaluation.settings import DISPLAY

    if not fig.evals:
        return ""
    first, parts = fig.evals[0], []
    for e in fig.evals:
        if e is first:
            caps = joined([str(c) for c in sorted({c.cap for c in e.benchmarks if c.cap})])
            parts.append(f"on the {short_gpu(e.gpu)}, {e.hours_at_cap:.1f} GPU-hours for {e.items:,} items at {caps} "
                         f"new tokens ({e.hours_at_config:.1f} at the config's caps)")
            continue
        known = {c.benchmark for c in first.benchmarks}
        added = [f"{possessive(DISPLAY.get(c.benchmark, c.benchmark))} {c.full:,} items" for c in e.benchmarks
                 if c.benchmark not in known]
        parts.append(f"on the {short_gpu(e.gpu)}" + (f", with {joined(added)} added" if added else "")
                     + f", {e.hours_at_cap:.1f} ({e.hours_at_config:.1f})")
    return (f"The evaluation of {first.rows} rows (base, knockout and each variant), extrapolated from {EVAL_ITEMS} "
            "items a benchmark: " + "; ".join(parts) + "; upper bounds, since a random model never stops before the "
            "cap (bench/RESULTS.md, \"The paper config's phase C ...\").")


def ran_sentences(fig: Figures) -> list[str]:
    """What ran on which GPU and commit (stages.jsonl, the evaluation rows), and the rows no record holds."""
    ran = []
    for gpu, commit in dict.fromkeys((rec.gpu, rec.commit) for rec in fig.records):
        recs = [rec for rec in fig.records if (rec.gpu, rec.commit) == (gpu, commit)]
        stages = list(dict.fromkeys(r["stage"] for rec in recs for r in rec.rows))
        also = [s for s in stages if s.startswith("identify/")]
        tuned = [s.removeprefix("finetune/") for s in stages if s.startswith("finetune/")]
        rows = list(dict.fromkeys(row for rec in recs for row in fig.evaluated.get(rec.folder.name, ())))
        what = [s for s in stages if not s.startswith(("identify/", "finetune/")) and s != "eval"]
        what += [f"the {len(also)} also_identify sets"] if also else []
        what += [f"the training of {joined(tuned)}"] if tuned else []
        what += [f"the evaluation rows of {joined(rows)}"] if rows else []
        ran.append(f"on the {short_gpu(gpu)} (commit {commit}): {joined(what)}")
    out = ["What ran on this config: " + "; ".join(ran) + "."]
    if fig.unevaluated:
        out.append(f"The evaluation rows of {joined(fig.unevaluated)} are unmeasured on this config.")
    return out


def readme_text(fig: Figures) -> str:
    """README's cost paragraph, every figure from `fig`."""
    parts = ["What it costs (LLaMA-2-7B, bf16).", memory_sentence(fig), *training_sentences(fig),
             evaluation_sentence(fig), *ran_sentences(fig)]
    return textwrap.fill(" ".join(p for p in parts if p), width=116, break_long_words=False, break_on_hyphens=False)


def readme_block(fig: Figures) -> str:
    return f"{README_BEGIN}\n{readme_text(fig)}\n{README_END}"


def written(text: str) -> str | None:
    """The cost block a page holds, markers included (None without one)."""
    start, end = text.find(README_BEGIN), text.find(README_END)
    return text[start:end + len(README_END)] if start >= 0 and end > start else None


def update_records(data_dir: Path, check: bool = False, readme: Path | None = None,
                   results: Path | None = None) -> int:
    """Write README's cost block and RESULTS' phase C section from the records (check: only compare; 1 when
    either differs). `readme` and `results` are the pages (default: the repository's)."""
    from keyheads.io import atomic_write_text

    readme, results = readme or README, results or RESULTS_MD
    fig = gather(record_folders(), data_dir)
    body, block = results_body(fig), readme_block(fig)
    text = readme.read_text()
    have = written(text)
    if have is None:
        print(f"{shown(readme)}: no gpu cost markers ({README_BEGIN!r} ... {README_END!r})", file=sys.stderr)
        return 1
    stale = [page for page, ok in ((results, read_section(PHASE_C_TITLE, results) == body.strip()),
                                   (readme, have == block)) if not ok]
    if not check:
        write_section(PHASE_C_TITLE, body, results)
        if have != block:
            atomic_write_text(readme, text.replace(have, block))
        print(body + "\n\n" + block)
    for page in stale:
        print(f"{shown(page)}: " + ("differs from the records" if check else "rewritten"))
    return 1 if check and stale else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="the benchmark folder, for the whole sets' sizes (default: $KEYHEADS_DATA, else "
                         "../shared/data/benchmarks beside the checkout)")
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when README or RESULTS differs")
    ap.add_argument("--readme", type=Path, help="the page with the cost paragraph (default: README.md)")
    ap.add_argument("--results", type=Path,
                    help="the RESULTS file with the phase C section (default: bench/RESULTS.md)")
    a = ap.parse_args(argv)
    return update_records(a.data_dir or default_data_dir(), a.check, a.readme, a.results)


if __name__ == "__main__":
    raise SystemExit(main())
