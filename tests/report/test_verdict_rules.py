"""Every verdict every rule can give, on golden cases built by hand (tests/report/golden.py), not on records.

Each case is a few stage outputs whose verdict follows from the rule's statement in keyheads.report.rules; the
committed records are only rendered (studies/pages.py). A rule whose threshold, test or missing-evidence branch
changes fails one of these cases.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from keyheads.report.findings import VERDICTS, findings
from keyheads.report.rules import RULE, RULES, RULES_VERSION
from keyheads.runfolder import RunFolder

from . import golden as g

Build = Callable[[Path], None]

# base rows of the eval cases: GSM8K 30 of 100 right
BASE = {"gsm8k": 30}


def _tuned(folder: Path, precise: tuple[int, int], full: tuple[int, int], per_item: bool = True,
           drift: dict | None = None, n: int = 100) -> None:
    """Precise SFT (2 heads) and full SFT, their GSM8K items (gained, lost) against the base row (30% right)."""
    g.finetune(folder, "precise", "precise")
    g.finetune(folder, "full", "full", tuned=100000)
    g.evaluation(folder, n, {"gsm8k": 3 * n // 10}, {"precise": ("adapter", "precise", {"gsm8k": precise}),
                                     "full": ("adapter", "full", {"gsm8k": full})}, drift=drift, per_item=per_item)


def _random(folder: Path, precise: int, draws: list[int], per_item: bool = True) -> None:
    """precise@2 and random@2 draws, each with its GSM8K items gained against the base row."""
    g.finetune(folder, "precise@2", "precise")
    rows = {"precise@2": ("adapter", "precise@2", {"gsm8k": (precise, 0)})}
    for i, gained in enumerate(draws):
        name = "random@2" + (f"-seed{i}" if i else "")
        g.finetune(folder, name, "precise", random_heads=True)
        rows[name] = ("adapter", name, {"gsm8k": (gained, 0)})
    g.evaluation(folder, 100, BASE, rows, per_item=per_item)


def _random_one_draw_unitemised(folder: Path) -> None:
    """Three draws, the per-item files of the last one missing."""
    _random(folder, 30, [5, 6, 4])
    for path in RunFolder(folder).eval_variant("random@2-seed2").glob("*.wrong.jsonl"):
        path.unlink()


def _knocked(folder: Path, n: int, base: dict[str, int], ko: dict[str, tuple[int, int]], per_item: bool = True):
    g.evaluation(folder, n, base, {"knockout": ("knockout", None, ko)}, per_item=per_item)


def _speed(folder: Path, precise: float, full: float, precise_params: int = 1000) -> None:
    g.finetune(folder, "precise", "precise", tuned=precise_params, speed=precise)
    g.finetune(folder, "full", "full", tuned=100000, speed=full)


def _nothing(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)


def _attention_only(folder: Path) -> None:
    g.attention(folder, ["operand"])


PAIRS_SET = (100, 100, 10)  # a knockout over 100 prompts: all right before, 10 right with the key heads out

CASES: list[tuple[int, str, str, Build]] = [
    # row 1: fewer than 5% of the heads past -5% (descriptive)
    (1, "holds", "3 of 100 heads", lambda f: g.identify(f, g.grid(10, 10, 3), [(0, 0)])),
    (1, "does not hold", "6 of 100 heads: 5% or more", lambda f: g.identify(f, g.grid(10, 10, 6), [(0, 0)])),
    (1, "does not hold", "no head past -5%", lambda f: g.identify(f, g.grid(10, 10, 0), [(0, 0)])),
    (1, "not testable", "another metric", lambda f: g.identify(f, g.grid(10, 10, 3), [(0, 0)], metric="logit-diff")),
    (1, "not measured", "no identify", _nothing),
    # row 2: more than half of the key heads in the middle third (layers 3-5 of 9)
    (2, "holds", "2 of 3 in the middle", lambda f: g.identify(f, g.grid(9, 4, 0), [(3, 0), (5, 1), (8, 0)])),
    (2, "partly", "1 of 2: not more than half", lambda f: g.identify(f, g.grid(9, 4, 0), [(4, 0), (0, 1)])),
    (2, "does not hold", "none in the middle", lambda f: g.identify(f, g.grid(9, 4, 0), [(0, 0), (8, 1)])),
    (2, "not measured", "no identify", _nothing),
    # row 3: Fisher per random draw, Holm over the draws
    (3, "holds", "10 of 100 right vs 3 draws near 93", lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92])),
    (3, "partly", "a large gap over only 2 draws", lambda f: g.knockout(f, *PAIRS_SET, [95, 90])),
    (3, "does not hold", "three draws each at raw p 0.02: none survives Holm",
     lambda f: g.knockout(f, 100, 100, 80, [91, 91, 91])),
    (3, "partly", "significant, but a gap of 4 points", lambda f: g.knockout(f, 2000, 2000, 1800, [1880] * 3)),
    (3, "holds", "significant, a gap of 6 points", lambda f: g.knockout(f, 2000, 2000, 1800, [1920] * 3)),
    (3, "partly", "significant against one draw of 3", lambda f: g.knockout(f, 100, 100, 80, [95, 81, 82])),
    (3, "does not hold", "3 of 120 prompts against 5 steady draws",
     lambda f: g.knockout(f, 120, 120, 117, [120, 120, 119, 120, 120])),
    (3, "holds", "the draw that is the key set left out", lambda f: g.knockout(f, *PAIRS_SET, [10, 95, 90, 92],
                                                                               key_draws=1)),
    (3, "not testable", "every draw is the key set (a model with no other heads)",
     lambda f: g.knockout(f, *PAIRS_SET, [10, 10, 10], key_draws=3)),
    (3, "not testable", "nothing right before", lambda f: g.knockout(f, 100, 0, 0, [0, 0, 0])),
    (3, "not measured", "no random control", lambda f: g.knockout(f, *PAIRS_SET, None)),
    (3, "not measured", "no knockout", _nothing),
    # row 4: per set and draw, Fisher, Holm over all; a set counts with every draw significant and 10 points
    (4, "holds", "3 of 3 sets far below 3 draws",
     lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92], [(50, 40, 5, [38, 39, 37])] * 3)),
    (4, "partly", "1 of 3 sets counts",
     lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92], [(50, 40, 5, [38, 39, 37])] + [(50, 40, 38, [39, 38, 40])] * 2)),
    (4, "partly", "every set far below, but one draw",
     lambda f: g.knockout(f, *PAIRS_SET, [95], [(50, 40, 5, [38])] * 3)),
    (4, "partly", "significant, 8 points of relative change beyond random",
     lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92], [(5000, 2500, 2300, [2500] * 3)] * 3)),
    (4, "holds", "significant, 12 points beyond random",
     lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92], [(5000, 2500, 2200, [2500] * 3)] * 3)),
    (4, "does not hold", "one set, three draws each at raw p 0.02: none survives Holm",
     lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92], [(100, 100, 80, [91] * 3)])),
    (4, "partly", "one set, significant against 1 of 3 draws", lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92],
                                                                                  [(100, 100, 70, [95, 80, 80])])),
    (4, "partly", "1 of 2 sets counts: not more than half",
     lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92], [(50, 40, 5, [38, 39, 37]), (50, 40, 38, [39, 38, 40])])),
    (4, "does not hold", "2-prompt gaps on 50-prompt sets",
     lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92], [(50, 40, 36, [38, 38, 38])] * 3)),
    (4, "not testable", "no set right before", lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92], [(50, 0, 0, [0, 0])])),
    (4, "not measured", "no transfer sets", lambda f: g.knockout(f, *PAIRS_SET, [95, 90, 92])),
    # row 5: more than half of the key heads attend to operands or the operator (descriptive)
    (5, "holds", "3 of 4", lambda f: g.attention(f, ["operand", "operator", "operand", "text"])),
    (5, "partly", "2 of 4: not more than half", lambda f: g.attention(f, ["operand", "operator", "text", "text"])),
    (5, "does not hold", "none", lambda f: g.attention(f, ["text", "text"])),
    (5, "not measured", "no attention stage", _nothing),
    # row 6: bootstrap over prompts of the later half's answer-specific write, and of it minus the earlier half's
    (6, "holds", "later half writes the answer, the earlier not", lambda f: g.mlp(f, g.noisy(40, 8, 0.05))),
    (6, "partly", "every layer writes it alike", lambda f: g.mlp(f, g.noisy(40, 8, 0.05, earlier=0.05))),
    (6, "does not hold", "noise only", lambda f: g.mlp(f, g.noisy(40, 8, 0.0))),
    (6, "does not hold", "a positive mean inside the noise", lambda f: g.mlp(f, g.noisy(40, 8, 0.002, spread=0.05))),
    (6, "does not hold", "the earlier half writes it, the later does not",
     lambda f: g.mlp(f, g.noisy(40, 8, 0.0, earlier=0.05))),
    (6, "holds", "20 prompts", lambda f: g.mlp(f, g.noisy(20, 8, 0.05))),
    (6, "not testable", "every prompt has the same answer: no other answer to compare with", lambda f: g.mlp(f, [])),
    (6, "not testable", "10 prompts", lambda f: g.mlp(f, g.noisy(10, 8, 0.05))),
    (6, "not measured", "a record without the per-prompt measure", lambda f: g.mlp(f, None)),
    # row 7: precise SFT's own significant gain, within 2 points of full SFT's
    (7, "holds", "+20 vs +21", lambda f: _tuned(f, (20, 0), (21, 0))),
    (7, "holds", "+20 vs +21.5: trailing by 1.5 points", lambda f: _tuned(f, (40, 0), (43, 0), n=200)),
    (7, "partly", "+20 vs +23: trailing by 3 points", lambda f: _tuned(f, (40, 0), (46, 0), n=200)),
    (7, "partly", "+12 significant, trailing +30", lambda f: _tuned(f, (12, 0), (30, 0))),
    (7, "does not hold", "+3 not significant, full +30", lambda f: _tuned(f, (3, 0), (30, 0))),
    (7, "not testable", "full SFT's significant loss beside precise SFT's +3", lambda f: _tuned(f, (3, 0), (0, 25))),
    (7, "not measured", "no per-item files", lambda f: _tuned(f, (20, 0), (21, 0), per_item=False)),
    (7, "not measured", "no full SFT", lambda f: g.finetune(f, "precise", "precise")),
    # row 8: precise SFT's generic KL significantly smaller than full SFT's
    (8, "holds", "KL 0.01 vs 0.3", lambda f: _tuned(f, (20, 0), (21, 0), drift={
        "precise": (0.01, 0.005, 0.015), "full": (0.3, 0.2, 0.4)})),
    (8, "holds", "intervals overlap, the difference is significant", lambda f: _tuned(f, (20, 0), (21, 0), drift={
        "precise": (0.10, 0.06, 0.14), "full": (0.16, 0.12, 0.20)})),
    (8, "does not hold", "KL 0.10 vs 0.105 with wide intervals", lambda f: _tuned(f, (20, 0), (21, 0), drift={
        "precise": (0.10, 0.05, 0.15), "full": (0.105, 0.05, 0.16)})),
    (8, "not measured", "no KL", lambda f: _tuned(f, (20, 0), (21, 0))),
    # row 9: precise SFT better than every random draw item by item (McNemar, Holm over the draws)
    (9, "holds", "+30 vs draws +5, +6, +4", lambda f: _random(f, 30, [5, 6, 4])),
    (9, "partly", "+30 vs 2 draws", lambda f: _random(f, 30, [5, 6])),
    (9, "partly", "better than 2 of 3 draws", lambda f: _random(f, 30, [5, 6, 29])),
    (9, "does not hold", "+5 items over each of 3 draws (raw p 0.03): none survives Holm",
     lambda f: _random(f, 5, [0, 0, 0])),
    (9, "does not hold", "a 1-point lead over 3 draws", lambda f: _random(f, 10, [9, 10, 9])),
    (9, "not measured", "no per-item files", lambda f: _random(f, 30, [5, 6, 4], per_item=False)),
    (9, "not measured", "one draw's per-item files missing", _random_one_draw_unitemised),
    (9, "not measured", "no random heads", lambda f: _tuned(f, (20, 0), (21, 0))),
    # row 10: speed ratio (descriptive)
    (10, "holds", "50 vs 15 samples/s", lambda f: _speed(f, 50.0, 15.0)),
    (10, "partly", "20 vs 15", lambda f: _speed(f, 20.0, 15.0)),
    (10, "partly", "40 vs 15: 2.7x", lambda f: _speed(f, 40.0, 15.0)),
    (10, "does not hold", "10 vs 15", lambda f: _speed(f, 10.0, 15.0)),
    (10, "does not hold", "faster, with more tuned parameters", lambda f: _speed(f, 50.0, 15.0, 200000)),
    (10, "not measured", "no full SFT", lambda f: g.finetune(f, "precise", "precise")),
    # row 11: math drops significantly; generic kept within a 5-point margin where the base is above chance
    (11, "holds", "math -25 items, MMLU unchanged", lambda f: _knocked(f, 200, {"gsm8k": 60, "mmlu": 120},
                                                                     {"gsm8k": (0, 25)})),
    (11, "partly", "math drops, MMLU -4 points with an interval reaching -12",
     lambda f: _knocked(f, 50, {"gsm8k": 20, "mmlu": 30}, {"gsm8k": (0, 15), "mmlu": (0, 2)})),
    (11, "holds", "MMLU -2.5 points, interval down to -3.5", lambda f: _knocked(f, 1000, {"gsm8k": 300, "mmlu": 600},
                                                                             {"gsm8k": (0, 60), "mmlu": (0, 25)})),
    (11, "partly", "MMLU -5 points, interval down to -7", lambda f: _knocked(f, 400, {"gsm8k": 120, "mmlu": 240},
                                                                           {"gsm8k": (0, 50), "mmlu": (0, 20)})),
    (11, "partly", "MMLU kept, math not significantly lower",
     lambda f: _knocked(f, 200, {"gsm8k": 60, "mmlu": 120}, {"gsm8k": (0, 2)})),
    (11, "does not hold", "MMLU -15 points, math unchanged",
     lambda f: _knocked(f, 200, {"gsm8k": 60, "mmlu": 120}, {"mmlu": (0, 30)})),
    (11, "not testable", "the base model at chance on MMLU",
     lambda f: _knocked(f, 200, {"gsm8k": 60, "mmlu": 50}, {"gsm8k": (0, 25)})),
    (11, "not measured", "no per-item files",
     lambda f: _knocked(f, 200, {"gsm8k": 60, "mmlu": 120}, {"gsm8k": (0, 25)}, per_item=False)),
    (11, "not measured", "no knockout row", lambda f: _tuned(f, (20, 0), (21, 0))),
]


@pytest.mark.parametrize("row, verdict, why, build", CASES, ids=[f"row{r}-{v}-{w}" for r, v, w, _ in CASES])
def test_each_golden_case_gets_its_verdict(tmp_path, row, verdict, why, build):
    build(tmp_path)
    finding = findings(tmp_path)[row - 1]
    assert finding.row == row and finding.claim == RULE[row].claim
    assert finding.verdict == verdict, (why, finding.evidence)
    assert finding.version == RULES_VERSION


def test_the_cases_cover_every_verdict_every_rule_can_give():
    covered = {(row, verdict) for row, verdict, _, _ in CASES}
    for rule in RULES:
        can = set(rule.requirements())
        assert can <= set(VERDICTS) and "not measured" in can
        assert {(rule.row, v) for v in can} <= covered, (rule.row, can - {v for r, v in covered if r == rule.row})
        assert {v for r, v in covered if r == rule.row} <= can, rule.row  # no case gives a verdict the rule denies


def test_every_rule_says_whether_it_tests_or_describes():
    for rule in RULES:
        assert rule.kind in ("measurement", "descriptive")
        assert (rule.family == "-") == (rule.kind == "descriptive") or rule.row in (6, 8), rule.row
        assert all(version <= RULES_VERSION for version in rule.changes)


@pytest.mark.parametrize("n, weak", [(100, True), (400, False)])
def test_a_set_too_small_to_detect_ten_points_is_said_underpowered(tmp_path, n, weak):
    """GSM8K at 30%: a McNemar test needs 359 items to detect a 10-point change at power 0.8 (the direct formula
    below); the verdict stands on the tests made, its cell says when they could not have told."""
    import math

    from scipy.stats import norm

    p, q = 0.30, 0.40
    psi = p * (1 - q) + q * (1 - p)
    need = math.ceil((norm.ppf(0.975) * math.sqrt(psi) + norm.ppf(0.8) * math.sqrt(psi - 0.01)) ** 2 / 0.01)
    _tuned(tmp_path, (n // 5, 0), (n // 5, 0), n=n)
    row7 = findings(tmp_path)[6]
    assert ("underpowered" in row7.key) == weak
    assert (f"GSM8K {n} items of the {need} that a McNemar test needs" in row7.evidence) == weak
