"""The whole study on one model, stage by stage, into one run folder:

    pairs.jsonl -> identify/ (effects, key heads) -> knockout/, attention/, mlp/ -> eval/ -> report.md

Each stage reads what the previous one wrote and is skipped when its output already exists,
so an interrupted run continues where it stopped. `keyheads demo` runs it on the bundled model
with small sizes; `keyheads run CONFIG.yaml` with any model and sizes.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .io import atomic_write_text, read_json, write_json


@dataclass
class PipelineConfig:
    """Settings of a full run.

    Attributes:
        model: bundled name, local folder, .gguf or hub id.
        out: the run folder.
        device, dtype: as for load_model.
        task: arithmetic task(s) of the pairs (addition, ..., or all).
        templates: template ids to use (empty: all of the task's).
        n: candidate pairs per task before keeping the correct ones.
        few_shot: solved examples before each prompt.
        shared_prefix: the same examples before every prompt of a template (computed once).
        method, metric: patching method and metric.
        top_k: key heads = the K most negative (None: the paper's -5% threshold).
        threshold: key heads below this effect (with top_k: both).
        knockout_k: largest k of the knockout curves; seeds: random orders.
        transfer_n: prompts per transfer set (other formats, SVAMP/GSM8K first tokens).
        analysis_samples: reference prompts for knockout/attention/MLP (None: all).
        eval_benchmarks: benchmarks of the evaluation table (empty: skip the stage).
        eval_limit: items per benchmark (None: all).
        eval_few_shot: exemplars per evaluation prompt (None: 4 for math, 5 for MMLU/CSQA).
        data_dir: benchmark folder (default $KEYHEADS_DATA).
        batch_size: prompts per forward pass.
        seed: seeds the pairs and the random orders.
    """

    model: str = "smollm2-135m"
    out: str = "runs/demo"
    device: str | None = None
    dtype: str | None = None
    task: str = "addition"
    templates: list[str] = field(default_factory=list)
    n: int = 300
    few_shot: int = 3
    shared_prefix: bool = False
    method: str = "path"
    metric: str = "relative-logit"
    top_k: int | None = 10
    threshold: float | None = None
    knockout_k: int = 20
    seeds: int = 5
    transfer_n: int = 100
    analysis_samples: int | None = 300
    eval_benchmarks: list[str] = field(default_factory=lambda: ["gsm8k", "addsub", "singleeq", "svamp", "mmlu", "csqa"])
    eval_limit: int | None = 50
    eval_few_shot: int | None = None
    data_dir: str | None = None
    batch_size: int = 16
    seed: int = 0

    @classmethod
    def from_yaml(cls, path: str | Path) -> "PipelineConfig":
        import yaml

        raw = yaml.safe_load(Path(path).read_text()) or {}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**raw)


def _stage(name: str, done: Path, log: list[str]):
    """Decorator-free helper: True when the stage must run; prints what is skipped."""
    if done.exists():
        print(f"[{name}] already done ({done}); skipping")
        log.append(f"{name}: reused {done.name}")
        return False
    print(f"[{name}] running", flush=True)
    return True


def run_pipeline(cfg: PipelineConfig) -> Path:
    from .models import load_model

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", asdict(cfg))
    log: list[str] = []
    t0 = time.perf_counter()
    model = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    print(model)

    pairs = out / "pairs.jsonl"
    if _stage("data", pairs, log):
        from .data.generate import PairConfig, make_pairs
        from .data.pairs import write_pairs
        from .data.templates import load_templates

        templates = load_templates()
        if cfg.templates:
            for tid in cfg.templates:
                templates.get(tid)
            templates.templates = [t for t in templates.templates if t.id in cfg.templates]
        tasks = templates.tasks if cfg.task == "all" else [cfg.task]
        made = make_pairs(templates, tasks, PairConfig(n=cfg.n, few_shot=cfg.few_shot, shared_prefix=cfg.shared_prefix, seed=cfg.seed,
                                                        single_token_answer=True),
                          model=model, keep_correct=True, batch_size=cfg.batch_size)
        write_pairs(pairs, made)

    identify_dir = out / "identify"
    if _stage("identify", identify_dir / "key_heads.json", log):
        from .patching import PatchConfig, describe, identify

        effects, keys = identify(model, pairs, PatchConfig(method=cfg.method, metric=cfg.metric,
                                                           batch_size=cfg.batch_size), identify_dir,
                                 threshold=cfg.threshold, top_k=cfg.top_k)
        print(describe(effects, keys))
    keys = read_json(identify_dir / "key_heads.json")
    heads = ",".join(k["label"] for k in keys["heads"])
    if not heads:
        raise ValueError(f"no key heads in {identify_dir / 'key_heads.json'}: set top_k in the config")

    from .analysis.run import (AttentionRun, KnockoutRun, MLPRun, Selection, run_attention, run_knockout,
                               run_mlp)

    effects_path = str(identify_dir / "effects.json")
    if _stage("knockout", out / "knockout" / "knockout.json", log):
        run_knockout(model, KnockoutRun(data=str(pairs), out=str(out / "knockout"),
                                        selection=Selection(heads=heads, effects=effects_path), k=cfg.knockout_k,
                                        seeds=cfg.seeds, seed=cfg.seed, n_samples=cfg.analysis_samples,
                                        batch_size=cfg.batch_size, data_dir=cfg.data_dir,
                                        transfer_n=cfg.transfer_n))
    if _stage("attention", out / "attention" / "attention.json", log):
        run_attention(model, AttentionRun(data=str(pairs), out=str(out / "attention"),
                                          selection=Selection(heads=heads, effects=effects_path),
                                          n_samples=cfg.analysis_samples, seed=cfg.seed, batch_size=cfg.batch_size))
    if _stage("mlp", out / "mlp" / "mlp.json", log):
        run_mlp(model, MLPRun(data=str(pairs), out=str(out / "mlp"), n_samples=cfg.analysis_samples, seed=cfg.seed,
                              batch_size=cfg.batch_size))

    if cfg.eval_benchmarks and _stage("eval", out / "eval" / "table.md", log):
        from .evaluation import EvalConfig, Variant, evaluate

        variants = [Variant.make("model", cfg.model),
                    Variant.make("knockout", cfg.model, label=f"{cfg.model} - {len(keys['heads'])} key heads",
                                 heads=heads, data=str(pairs))]
        evaluate(variants, EvalConfig(benchmarks=tuple(cfg.eval_benchmarks), data_dir=cfg.data_dir,
                                      limit=cfg.eval_limit, few_shot=cfg.eval_few_shot,
                                      batch_size=cfg.batch_size), out / "eval",
                 loader=lambda name: model)

    report = write_report(out, cfg, keys)
    print(f"done in {time.perf_counter() - t0:.0f} s; report: {report}")
    return report


def _read(path: Path):
    return read_json(path) if path.exists() else None


def write_report(out: Path, cfg: PipelineConfig, keys: dict) -> Path:
    """report.md: the figures and the numbers each stage wrote, in the paper's order."""
    lines = [f"# keyheads run: {cfg.model}", "", f"Config: `{json.dumps(asdict(cfg))}`", ""]
    n_pairs = sum(1 for _ in open(out / "pairs.jsonl", encoding="utf-8"))
    lines += ["## 1. Identify", "", f"{n_pairs} reference/counterfactual pairs (`pairs.jsonl`), "
              f"{cfg.method} patching with metric {cfg.metric}.", "",
              f"Key heads ({len(keys['heads'])} of {keys['n_heads_total']}): "
              + ", ".join(f"{k['label']} ({k['effect']:+.3g})" for k in keys["heads"]), "",
              "![effects](identify/heatmap.png)", ""]
    for name, title in (("knockout", "2. Knockout"), ("attention", "3. Attention of the key heads"),
                        ("mlp", "4. What the MLPs compute")):
        folder = out / name
        if not folder.is_dir():
            continue
        lines += [f"## {title}", ""]
        for text in sorted(folder.glob("*.txt")):
            lines += ["```", text.read_text(encoding="utf-8").strip(), "```", ""]
        lines += [f"![{p.stem}]({name}/{p.name})" for p in sorted(folder.glob("*.png"))] + [""]
    table = out / "eval" / "table.md"
    if table.exists():
        lines += ["## 5. Evaluation", "", table.read_text(encoding="utf-8").strip(), ""]
    return atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
