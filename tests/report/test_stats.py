"""keyheads.report.stats against computations written out here, and the item-by-item family of a run folder."""
import math
import random
from pathlib import Path

import pytest

from keyheads.components import Components
from keyheads.io import write_json, write_jsonl
from keyheads.report.rundata import delta_band, eval_table, paired_family, seed_sets
from keyheads.report.stats import (
    band,
    holm,
    mcnemar_p,
    newcombe_paired,
    paired_sets,
    paired_test,
    seed_free,
    seed_groups,
)
from keyheads.runfolder import RunFolder, variant_slug

from .handmade import finetune_result

Z = 1.959963984540054  # the normal 97.5% point


def holm_by_hand(pvalues):
    """Sort; the i-th smallest (from 0) times m - i; running maximum in that order; at most 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, (m - rank) * pvalues[i])
        adjusted[i] = min(1.0, running)
    return adjusted


def test_holm_is_the_step_down_written_out():
    assert holm([0.01, 0.02, 0.03]) == pytest.approx([0.03, 0.04, 0.04])  # not Bonferroni's 0.03, 0.06, 0.09
    assert holm([0.04, 0.001]) == pytest.approx([0.04, 0.002])  # in the given order, not sorted
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # clipped at 1
    assert holm([]) == []
    rng = random.Random(0)
    for m in (1, 2, 7, 48):
        ps = [rng.random() ** 3 for _ in range(m)] + [0.01, 0.01]  # ties too
        assert holm(ps) == pytest.approx(holm_by_hand(ps), abs=1e-12)


def test_mcnemar_p_is_the_two_sided_exact_binomial_written_out():
    def by_hand(g, l):
        m, k = g + l, min(g, l)
        return min(1.0, 2 * sum(math.comb(m, i) for i in range(k + 1)) / 2**m)

    assert mcnemar_p(6, 0) == pytest.approx(2 / 64)
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0
    for g, l in [(1, 18), (2, 7), (4, 11), (0, 31), (8, 9), (22, 6)]:
        assert mcnemar_p(g, l) == pytest.approx(by_hand(g, l), rel=1e-9), (g, l)
        assert mcnemar_p(g, l) == mcnemar_p(l, g)


def wilson_by_hand(k, n):
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return centre - half, centre + half


def test_paired_interval_is_newcombes_method_10_by_hand():
    # 50 items; the reference right on 24; the row gains 6 and loses none: a=24 both right, b=6, c=0, d=20
    a, b, c, d, n = 24, 6, 0, 20, 50
    p1, p2 = (a + b) / n, (a + c) / n              # 0.60 and 0.48
    l1, u1 = wilson_by_hand(a + b, n)              # 0.4618, 0.7239
    l2, u2 = wilson_by_hand(a + c, n)              # 0.3465, 0.6164
    phi = (a * d - b * c) / math.sqrt((a + b) * (c + d) * (a + c) * (b + d))  # 480 / sqrt(30*20*24*26) = 0.8006
    lower = (p1 - p2) - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    upper = (p1 - p2) + math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    assert (lower, upper) == pytest.approx((0.0303, 0.2044), abs=1e-4)
    assert newcombe_paired(a, b, c, d) == pytest.approx((lower, upper), abs=1e-12)
    t = paired_test(6, 0, 50, 24)
    assert (t.gained, t.lost, t.delta) == (6, 0, pytest.approx(0.12)) and t.ci == pytest.approx((lower, upper))
    assert t.p == pytest.approx(2 / 64) and t.p_holm is None and t.significant
    assert t.cell() == "+6 / -0, Δ +12.0 [+3.0, +20.4], p 0.031"
    # the row and the reference swapped: the same interval, mirrored
    assert paired_test(0, 6, 50, 30).ci == pytest.approx((-upper, -lower), abs=1e-12)
    # the same counts from the ids each row got wrong
    base_wrong = {f"q{i}" for i in range(26)}            # 24 of 50 right
    row_wrong = {f"q{i}" for i in range(6, 26)}          # gained q0..q5
    assert paired_sets(base_wrong, row_wrong, 50) == t
    with pytest.raises(ValueError):
        paired_test(6, 30, 50, 24)  # loses more items than the reference got right


def test_seeds_of_one_control_are_grouped_into_a_band():
    names = ["random@40", "random@40-seed1", "random@40_seed2", "precise@40", "precise@40-x", "random@10",
             "m - 10 random heads knocked out (seed 1)", "m - 10 random heads knocked out (seed 2)",
             "precise@20", "precise@20",  # the same name twice, no seed: not a band
             "precise@8-seed1"]  # one seed alone: not a band either
    assert seed_groups(names) == {"random@40": [0, 1, 2], "m - 10 random heads knocked out": [6, 7]}
    assert seed_free("qwen + random@40-seed3 SFT") == "qwen + random@40 SFT"
    b = band([0.02, -0.04, 0.06])
    assert (b.mean, b.low, b.high, b.count) == (pytest.approx(0.01 + 1 / 300), -0.04, 0.06, 3)
    assert b.text() == "mean +1.3, range -4.0 to +6.0 over 3 seeds"


def fake_eval(root: Path, n: int = 50) -> Path:
    """A run folder's eval/ with a base row, a knockout row and three seeds of random@40, on two benchmarks:
    results.json and each row's <benchmark>.wrong.jsonl, as the evaluator writes them."""
    wrong = {  # label -> benchmark -> the items it got wrong (of q0..q49)
        "m (base)": {"gsm8k": range(0, 26), "mmlu": range(0, 20)},
        "m - 10 key heads knocked out": {"gsm8k": range(0, 44), "mmlu": range(0, 22)},
        "m + random@40 SFT": {"gsm8k": range(6, 26), "mmlu": range(0, 20)},
        "m + random@40-seed1 SFT": {"gsm8k": range(2, 30), "mmlu": range(1, 21)},
        "m + random@40-seed2 SFT": {"gsm8k": range(0, 26), "mmlu": range(0, 25)},
    }
    variants = []
    for label, sets in wrong.items():
        run = label.split(" + ")[1].removesuffix(" SFT") if " + " in label else None
        kind = "adapter" if run else "knockout" if "knocked" in label else "model"
        benchmarks = {}
        for bench, ids in sets.items():
            write_jsonl(root / "eval" / variant_slug(label) / f"{bench}.wrong.jsonl", ({"id": f"q{i}"} for i in ids))
            benchmarks[bench] = {"accuracy": 1 - len(ids) / n, "n": n, "ci95": [0.0, 1.0]}
        spec = {"kind": kind, "model": f"/elsewhere/finetune/{run}" if run else "m", "options": {}}
        variants.append({"label": label, "info": {"variant": spec}, "benchmarks": benchmarks})
        if run:
            write_json(root / "finetune" / run / "finetune.json",
                       finetune_result("precise", Components((), (), "random 40 heads"), 1, 1.0).to_json())
    write_json(root / "eval" / "results.json", {"config": {"benchmarks": ["gsm8k", "mmlu"]}, "variants": variants})
    return root


def test_the_family_is_every_row_against_the_base_on_every_benchmark(tmp_path):
    run = RunFolder(fake_eval(tmp_path))
    table = eval_table(run)
    pairs = paired_family(run, table)
    assert len(pairs) == 4 * 2
    t = pairs[("m + random@40 SFT", "gsm8k")]
    assert (t.gained, t.lost, t.n, t.reference_right) == (6, 0, 50, 24)
    assert [x.p_holm for x in pairs.values()] == pytest.approx(holm([x.p for x in pairs.values()]))
    ko = pairs[("m - 10 key heads knocked out", "gsm8k")]
    assert (ko.gained, ko.lost) == (0, 18) and ko.significant and not t.significant  # 0.031 * 8 > 0.05
    assert t.cell() == f"+6 / -0, Δ +12.0 [+3.0, +20.4], p 0.031 (Holm {t.p_holm:.2g})"
    # a row whose wrong items were not written is left out of the family, not counted as all right
    (run.eval_wrong("m + random@40-seed2 SFT", "mmlu")).unlink()
    assert ("m + random@40-seed2 SFT", "mmlu") not in paired_family(RunFolder(tmp_path), eval_table(run))

    [(name, seeds)] = seed_sets([r for r in table.rows if r is not table.base])
    assert name == "m + random@40 SFT" and [r.run for r in seeds] == ["random@40", "random@40-seed1",
                                                                      "random@40-seed2"]
    spread = delta_band(table, seeds, ["gsm8k"])
    assert spread is not None and (spread.mean, spread.low, spread.high) == pytest.approx((0.08 / 3, -0.04, 0.12))


def test_run_folder_names_eval_rows_as_the_evaluator_does():
    from keyheads.evaluation.runner import slug

    for label in ("qwen2.5-coder-1.5b + precise@40+mlp3 SFT", "m - 10 key heads knocked out", "a/b (c)", "!!"):
        assert variant_slug(label) == slug(label)
