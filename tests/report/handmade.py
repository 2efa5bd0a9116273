"""A small hand-written run folder whose numbers either support every claim of the paper or none,
so that the findings' answers are known in advance (and each rule is seen to fail too).

Each file is built as the stage's result type and saved by its to_json(), as the stages save theirs."""
from pathlib import Path

from keyheads.components import Components
from keyheads.effects import Effects
from keyheads.heads import Head
from keyheads.io import write_json
from keyheads.results.attention import AttentionResult, HeadLabel
from keyheads.results.evaluation import BenchmarkSummary, EvalResults, VariantInfo, VariantResult, VariantSpec
from keyheads.results.finetune import FinetuneResult, Training, TrainingData
from keyheads.results.identify import KeyHead, KeyHeads
from keyheads.results.knockout import HeadsKnockout, KnockoutCurves, KnockoutResult, Transfer, TransferRow
from keyheads.results.mlp import MLPCase, MLPResult, TurningPoints

BENCHMARKS = ["gsm8k", "mmlu"]
KEY = [Head(2, 0), Head(2, 1)]


def _summary(acc: float, n: int = 100) -> BenchmarkSummary:
    return BenchmarkSummary(accuracy=acc, ci95=[max(0.0, acc - 0.05), min(1.0, acc + 0.05)], n=n,
                            correct=round(acc * n), split="test")


def finetune_result(method: str, components: Components | None, tuned: int, speed: float) -> FinetuneResult:
    """finetune.json of a short hand-made run: `tuned` parameters trained at `speed` samples a second."""
    return FinetuneResult(
        base_model="hand-made", base_fingerprint="abc123", method=method, components=components,
        data=TrainingData(name="hand-made", sha256="0" * 64, n=3), config={"seed": 0},
        kv="group" if method == "precise" else None, tuned_params=tuned, total_params=100000, versions={},
        train=Training(steps=3, steps_this_run=3, samples_this_run=6, samples_per_second=speed, final_loss=1.0,
                       losses=[2.0, 1.5, 1.0], seconds_this_run=1.0, wall_seconds=1.2, processes=1, parallel="ddp",
                       device="cpu"))


def make_run(folder: Path, holds: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", {"model": "hand-made", "seed": 0, "seeds": 5})
    (folder / "pairs.jsonl").write_text('{"reference": "1 + 2 = ", "counterfactual": "1 @ 2 = ", "answer": "3"}\n')
    pairs = str(folder / "pairs.jsonl")

    # 32 heads: 2 (good) or 10 (bad) below the paper's -5%
    # the 2 key heads sit in layer 2 of 4, the middle third (good), or the bad 10 in layers 0-1
    n_key = 2 if holds else 10
    key_layer = KEY[0].layer if holds else 0
    heads = [[-0.2 if (l == key_layer and h < n_key if holds else 8 * l + h < n_key) else -0.01 for h in range(8)]
             for l in range(4)]
    write_json(folder / "identify" / "effects.json", Effects(
        metric="relative-logit", method="path", model="hand-made", n_samples=50, n_excluded=0, data_sha256=None,
        heads=heads, mlps=[0.0, -0.01, -0.1, -0.2]).to_json())
    write_json(folder / "identify" / "key_heads.json", KeyHeads(
        metric="relative-logit", threshold=-0.05, top_k=None, n_heads_total=32, mlps=[],
        heads=[KeyHead(layer=key_layer, head=h, label=f"{key_layer}.{h}", effect=-0.2) for h in range(2)]).to_json())

    after = 0.2 if holds else 0.78
    transfer = [TransferRow(set="pairs.jsonl (identification data)", n=50, accuracy_before=0.8, accuracy_after=after,
                            relative_change=(after - 0.8) / 0.8, accuracy_random_heads=0.78,
                            relative_change_random_heads=-0.025, fallback="", note="")]
    for name in ("SVAMP (first answer token)", "multi-digit (A + B, 3 digits)"):
        rel = -0.6 if holds else -0.05
        transfer.append(TransferRow(set=name, n=40, accuracy_before=0.5, accuracy_after=0.5 * (1 + rel),
                                    relative_change=rel, accuracy_random_heads=0.48, relative_change_random_heads=-0.04,
                                    fallback="", note=""))
    write_json(folder / "knockout" / "knockout.json", KnockoutResult(
        model="hand-made", data=pairs, n_samples=50, n_counterfactual=50, mean="aligned", effects=None, config={},
        notes=[],
        key_heads=HeadsKnockout(heads=KEY, accuracy_before=0.8, accuracy_after=after,
                                relative_change=(after - 0.8) / 0.8),
        curves=KnockoutCurves(k=[0, 1, 2], effect_rank=[0.8, 0.5, after], random_rank=[[0.8, 0.79, 0.78]] * 2,
                              random_mean=[0.8, 0.79, 0.78], random_std=[0.0, 0.01, 0.01], effect_order=KEY),
        transfer=Transfer(heads=KEY, random_heads=[Head(3, 1), Head(2, 5)], rows=transfer, cases=[]),
    ).to_json())

    labels = ("operand", "operator") if holds else ("text", "text")
    write_json(folder / "attention" / "attention.json", AttentionResult(
        model="hand-made", data=pairs, n_samples=50, heads=KEY, roles=["A", "B", "operator", "other", "first"],
        per_task={}, counts={"addition": 50}, all=[], notes=[], effects=None,
        labels=[HeadLabel(head=KEY[i], label=lab, lean="operand", operand_A_plus_B=0.5, operator=0.2,
                          other_words=0.1, first_token=0.2, top_other_tokens=[("=", 0.05)])
                for i, lab in enumerate(labels)]).to_json())

    tp = TurningPoints(start=1, inflection=2, end=3) if holds else TurningPoints(start=0, inflection=0, end=0)
    write_json(folder / "mlp" / "mlp.json", MLPResult(
        model="hand-made", data=pairs, n_samples=50, read_point="resid_mid", turning_points=tp, rule="test",
        curves={}, answer_contrast=[0.0, 0.05, 0.1, 0.2] if holds else [-0.1, 0.0, 0.0, 0.0],
        operand_contrast=[0.0, 0.1, 0.3, 0.2],
        case=MLPCase(prompt="4 + 3 = ", answer="7", numbers=["1", "2", "3"], top3_per_layer=[["1", "2", "3"]] * 4,
                     cosine=[])).to_json())

    runs = {"precise-top2": ("precise", 1000, 50.0 if holds else 10.0), "full": ("full", 100000, 15.0)}
    for name, (method, tuned, speed) in runs.items():
        comps = Components(tuple(KEY), (), "top-2 heads of effects.json") if method == "precise" else None
        write_json(folder / "finetune" / name / "finetune.json", finetune_result(method, comps, tuned, speed).to_json())

    acc = {  # label -> (kind, run, gsm8k, mmlu)
        "base": ("model", None, 0.2, 0.5),
        "knockout": ("knockout", None, 0.05, 0.49 if holds else 0.3),
        "precise": ("adapter", "precise-top2", 0.35 if holds else 0.2, 0.5 if holds else 0.4),
        "full": ("adapter", "full", 0.36, 0.45),
    }
    variants = []
    for label, (kind, run, g, m) in acc.items():
        spec = VariantSpec(kind=kind, model=f"/elsewhere/finetune/{run}" if run else "hand-made", options={})
        variants.append(VariantResult(label=label, fingerprint=label, info=VariantInfo(variant=spec),
                                      benchmarks={"gsm8k": _summary(g), "mmlu": _summary(m)}))
    write_json(folder / "eval" / "results.json",
               EvalResults(config={"benchmarks": BENCHMARKS}, variants=variants).to_json())
    return folder
