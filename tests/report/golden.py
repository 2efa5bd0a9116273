"""Golden cases of the verdict rules: hand-built stage outputs, a few lines each, whose verdict is known from the
rule's statement (keyheads.report.rules) before any record is seen.

Each builder writes one stage's file as the stage's result type saves it, with only the numbers a rule reads; the
rest is filler. tests/report/test_verdict_rules.py lists the cases: every verdict every row can give.
"""
from __future__ import annotations

from pathlib import Path

from keyheads.components import Components
from keyheads.effects import Effects
from keyheads.heads import Head
from keyheads.io import write_json, write_jsonl
from keyheads.results.attention import AttentionResult, HeadLabel
from keyheads.results.evaluation import BenchmarkSummary, EvalResults, VariantInfo, VariantResult, VariantSpec
from keyheads.results.identify import KeyHead, KeyHeads
from keyheads.results.knockout import HeadsKnockout, KnockoutCurves, KnockoutResult, Transfer, TransferRow
from keyheads.results.mlp import MLPCase, MLPResult, TurningPoints
from keyheads.runfolder import RunFolder

from .handmade import finetune_result


def identify(folder: Path, effects: list[list[float]], key: list[tuple[int, int]],
             metric: str = "relative-logit") -> None:
    """effects.json with these head effects ([layer][head]) and key_heads.json with these (layer, head)."""
    write_json(folder / "identify" / "effects.json", Effects(
        metric=metric, method="path", model="golden", n_samples=50, n_excluded=0, data_sha256=None,
        heads=effects, mlps=[0.0] * len(effects)).to_json())
    write_json(folder / "identify" / "key_heads.json", KeyHeads(
        metric=metric, threshold=-0.05, top_k=None, n_heads_total=sum(map(len, effects)), mlps=[],
        heads=[KeyHead(layer=l, head=h, label=f"{l}.{h}", effect=effects[l][h]) for l, h in key]).to_json())


def grid(layers: int, heads: int, strong: int, value: float = -0.2) -> list[list[float]]:
    """Effects of layers x heads heads: the first `strong` (in reading order) at `value`, the rest at -1%."""
    return [[value if heads * l + h < strong else -0.01 for h in range(heads)] for l in range(layers)]


def knockout(folder: Path, n: int, right_before: int, right_after: int, draws: list[int] | None,
             transfer: list[tuple[int, int, int, list[int]]] | None = None, n_key: int = 2,
             key_draws: int = 0) -> None:
    """knockout.json over n prompts: right_before of them right, right_after with the n_key key heads out, and each
    random draw's count with as many random heads out (draws None: no curves); the first `key_draws` draws knock out
    the key heads themselves, the others heads of layer 1. transfer: per extra set (n, right before, right after the
    key heads' knockout, each draw's right count)."""
    key = [Head(0, h) for h in range(n_key)]
    orders = [key if i < key_draws else [Head(1, h + i) for h in range(n_key)] for i in range(len(draws or []))]
    acc = [right_before / n] * (n_key + 1)
    curves = None if draws is None else KnockoutCurves(
        k=list(range(n_key + 1)), effect_rank=acc[:-1] + [right_after / n],
        random_rank=[acc[:-1] + [d / n] for d in draws], random_mean=acc, random_std=[0.0] * (n_key + 1),
        effect_order=key, random_orders=orders)
    rows = [TransferRow.measured("pairs.jsonl (identification data)", n, right_before / n, right_after / n,
                                 controls=[d / n for d in draws or []])]
    rows += [TransferRow.measured(f"set {i}", m, b / m, a / m, controls=[d / m for d in ds])
             for i, (m, b, a, ds) in enumerate(transfer or [])]
    write_json(folder / "knockout" / "knockout.json", KnockoutResult(
        model="golden", data="pairs.jsonl", n_samples=n, n_counterfactual=n, mean="aligned", effects=None, config={},
        key_heads=HeadsKnockout(heads=key, accuracy_before=right_before / n, accuracy_after=right_after / n,
                                relative_change=(right_after - right_before) / right_before if right_before else
                                float("nan")),
        curves=curves,
        transfer=None if transfer is None else Transfer(heads=key, random_heads=None, rows=rows)).to_json())


def attention(folder: Path, labels: list[str]) -> None:
    heads = [Head(0, h) for h in range(len(labels))]
    write_json(folder / "attention" / "attention.json", AttentionResult(
        model="golden", data="pairs.jsonl", n_samples=50, heads=heads, roles=["A", "B", "operator", "other", "first"],
        per_task={}, counts={}, all=[], notes=[], effects=None,
        labels=[HeadLabel(head=h, label=label, lean="operand", operand_A_plus_B=0.5, operator=0.2, other_words=0.1,
                          first_token=0.2, top_other_tokens=[]) for h, label in zip(heads, labels)]).to_json())


def mlp(folder: Path, answer_specific: list[list[float]] | None) -> None:
    """mlp.json whose per-prompt answer-specific writes ([prompt][layer]) are these (None: an older release's)."""
    layers = len(answer_specific[0]) if answer_specific else 4
    write_json(folder / "mlp" / "mlp.json", MLPResult(
        model="golden", data="pairs.jsonl", n_samples=len(answer_specific or []), read_point="resid_mid",
        curves={}, operand_contrast=[0.0] * layers, answer_contrast=[0.0] * layers,
        turning_points=TurningPoints(start=0, inflection=1, end=layers - 1), rule="golden",
        case=MLPCase(prompt="4 + 3 = ", answer="7", numbers=[], top3_per_layer=[], cosine=[]),
        answer_specific=answer_specific).to_json())


def noisy(prompts: int, layers: int, later: float, earlier: float = 0.0, spread: float = 0.01) -> list[list[float]]:
    """answer_specific: `later` in the later half's layers, `earlier` in the others, plus a fixed zigzag of +-spread
    across prompts (deterministic noise, mean 0 over an even number of prompts)."""
    return [[(later if 2 * l >= layers else earlier) + (spread if i % 2 else -spread) * (1 + l % 3)
             for l in range(layers)] for i in range(prompts)]


def finetune(folder: Path, name: str, method: str, heads: int = 2, tuned: int = 1000, speed: float = 10.0,
             random_heads: bool = False) -> None:
    comps = None if method == "full" else Components(
        tuple(Head(0, h) for h in range(heads)), (),
        f"random {heads} heads (seed 0)" if random_heads else f"top-{heads} heads of effects.json")
    write_json(folder / "finetune" / name / "finetune.json",
               finetune_result(method, comps, tuned, speed).to_json())


Outcomes = dict[str, tuple[int, int]]  # benchmark -> (items gained, items lost) against the base row


def evaluation(folder: Path, n: int, base: dict[str, int], rows: dict[str, tuple[str, str | None, Outcomes]],
               drift: dict[str, tuple[float, float, float]] | None = None, per_item: bool = True) -> None:
    """eval/results.json and the per-item files: the base row gets base[b] of n items of benchmark b right (items
    0..k-1); each other row (label -> (kind, its finetune run, outcomes)) loses the first `lost` of those and gains
    the next `gained` after them. drift: label -> (KL, its 95% interval) on generic text."""
    right = {"base": {b: set(range(k)) for b, k in base.items()}}
    for label, (_, _, outcomes) in rows.items():
        right[label] = {b: set(range(lost, k)) | set(range(k, k + outcomes.get(b, (0, 0))[0]))
                        for b, k in base.items() for lost in [outcomes.get(b, (0, 0))[1]]}
    kinds = {"base": ("model", None), **{label: (kind, run) for label, (kind, run, _) in rows.items()}}
    variants = []
    for label, (kind, run) in kinds.items():
        benchmarks = {b: BenchmarkSummary(accuracy=len(r) / n, n=n, correct=len(r)) for b, r in right[label].items()}
        if drift and label in drift:
            kl, lo, hi = drift[label]
            benchmarks["generic-kl"] = BenchmarkSummary(kind="drift", n=n, kl=kl, kl_ci95=[lo, hi])
        spec = VariantSpec(kind=kind, model=f"/elsewhere/finetune/{run}" if run else "golden", options={})
        variants.append(VariantResult(label=label, fingerprint=label, info=VariantInfo(variant=spec),
                                      benchmarks=benchmarks))
        if per_item:
            for b, r in right[label].items():
                write_jsonl(RunFolder(folder).eval_wrong(label, b), ({"id": str(i)} for i in range(n) if i not in r))
    write_json(folder / "eval" / "results.json",
               EvalResults(config={"benchmarks": list(base)}, variants=variants).to_json())
