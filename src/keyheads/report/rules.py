"""The verdict rules, one per claim of the findings table, stated before any record they judge.

Each `Rule` says what the claim is, whether it rests on a measurement (then its test uses the row's own sampling
noise: exact tests on items or prompts, or a bootstrap over prompts) or is descriptive (a count against a stated
threshold, no test), the family its p values are adjusted over, and what each verdict requires. The rules carry a
version (`RULES_VERSION`); every rendered verdict names it. A rule changes only with golden cases that motivate it
(tests/report/golden.py), and the change re-judges every record (studies/rejudge.py), which lists each verdict that
moved in the studies' change log. keyheads.report.findings applies the rules; this module only states them.

Shared by every row: missing evidence of any kind (a stage that did not run, a per-item file that is not there, a
measure an older release did not save) gives "not measured", never a pass; "not testable" means the evidence is
there but cannot decide the claim (nothing right before a knockout, a skill the model does not have).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ..effects import PAPER_THRESHOLD
from .stats import ALPHA

RULES_VERSION = 2

FEW_HEADS = 0.05        # the paper's "< 5%" of the heads are key heads
BEYOND_RANDOM = 0.05    # the key heads' knockout costs at least 5 accuracy points more than random heads'
TRANSFER_GAP = 0.10     # on another set, 10 points of relative accuracy more than random heads'
GENERIC_MARGIN = 0.05   # non-inferiority margin of "generic skills kept": the change's 95% interval above -5 points
LIKE_FULL = 0.02        # precise SFT's math gain may trail full SFT's by at most 2 points
PAPER_SPEEDUP = 3.0     # the paper: precise SFT trains "at least threefold" faster
MIN_DRAWS = 3           # a random control decides "holds" only with at least this many draws
MIN_PROMPTS = 20        # the MLP bootstrap needs at least this many prompts

Kind = Literal["measurement", "descriptive"]


@dataclass(frozen=True)
class Rule:
    """One claim's rule: its test and what each verdict requires (empty: the rule never gives that verdict)."""

    row: int
    claim: str
    kind: Kind
    test: str
    family: str
    holds: str
    partly: str
    does_not_hold: str
    not_testable: str
    not_measured: str
    changes: dict[int, str] = field(default_factory=dict)  # version -> what changed then, and the cases that led to it
    arithmetic: bool = False  # the claim is about arithmetic (its operands, formats, math benchmarks): a run of
    #                           another task skips it

    def requirements(self) -> dict[str, str]:
        """verdict -> what it requires, for the verdicts this rule can give."""
        pairs = {"holds": self.holds, "partly": self.partly, "does not hold": self.does_not_hold,
                 "not testable": self.not_testable, "not measured": self.not_measured}
        return {k: v for k, v in pairs.items() if v}

    def text(self) -> str:
        """One line for a finding's evidence: the test, then each verdict's requirement."""
        return f"{self.test}. " + "; ".join(f"{k}: {v}" for k, v in self.requirements().items())


_P = f"p < {ALPHA:g}"
_HOLM_TABLE = "Holm over every item-by-item test of the run's eval table (each row against the base row)"

RULES: tuple[Rule, ...] = (
    Rule(1, "Only a few percent of the heads are key heads (relative logit change past the paper's -5%)",
         "descriptive",
         f"the share of heads whose path-patching effect is below {100 * PAPER_THRESHOLD:.0f}% (relative logit "
         "change; no test: the effects are one deterministic sweep)", "-",
         f"at least one head and fewer than {100 * FEW_HEADS:.0f}% of the heads", "",
         f"no head, or {100 * FEW_HEADS:.0f}% or more", "the effects are in another metric than relative-logit",
         "identify did not run",
         {2: f"the share must be under {100 * FEW_HEADS:.0f}%, the paper's '< 5%' that the row's label states "
             "(it accepted 10%); golden case: 6 of 100 heads past -5%"}),
    Rule(2, "The key heads sit in the middle layers", "descriptive",
         "the key heads' layers against the middle third of the depth (the paper's 12-17 of 32); no test", "-",
         "more than half of the key heads in the middle third", "some, but not more than half",
         "none", "", "identify did not run or took no key heads",
         {2: "a majority is more than half, as in rows 4 and 5 (it took 'at least half'); golden case: 1 of 2 "
             "key heads in the middle third"}),
    Rule(3, "Knocking out the key heads breaks the task far more than knocking out as many random heads",
         "measurement",
         "prompts right with the key heads out against prompts right with as many random heads out, one draw "
         "at a time (the knockout curves' random orders at k = the number of key heads, else the transfer "
         "table's control on the identification data; a draw that is the key heads themselves is left out): "
         "one-sided Fisher exact test on the counts",
         "Holm over the random draws",
         f"every draw's test significant ({_P}, at least {MIN_DRAWS} draws) and the mean gap at least "
         f"{100 * BEYOND_RANDOM:.0f} points", "at least one draw's test significant, short of holds",
         "no draw's test significant",
         "no prompt right before the knockout, or every random draw is the key heads themselves",
         "the knockout did not run, or without a random control",
         {2: "the key-head row's own sampling noise enters through an exact test on its counts (it compared the "
             "gap with 2 std of 3-5 draws, so 3 of 120 prompts could give partly); a draw that is the key set "
             "itself is no control; golden cases: a 3-of-120 gap against 5 steady draws, a large gap over 2 "
             "draws, and the compiled programs whose heads are all on the circuit"}),
    Rule(4, "The key heads matter on arithmetic in other formats too (SVAMP, multi-digit, decimals), beyond "
            "random heads", "measurement",
         "per transfer set, prompts right with the key heads out against each random draw: one-sided Fisher "
         f"exact test; a set counts when every draw's test is significant and the key heads' relative change is "
         f"{100 * TRANSFER_GAP:.0f} points beyond the draws' mean", "Holm over every set and draw",
         f"more than half of the sets count, over at least {MIN_DRAWS} draws",
         "at least one set-and-draw test significant, short of holds", "no test significant",
         "no transfer set had right answers before the knockout and a random control",
         "the transfer sets were not run",
         {2: "an exact test per set and draw replaces the comparison with 2 std of the draws, which ignored the "
             "sets' own sampling noise; golden cases: 50-prompt sets with a 2-prompt gap"}),
    Rule(5, "The key heads attend to the operands and the operator", "descriptive",
         "the attention stage's label of each key head (where most of its attention goes); no test", "-",
         "more than half of the key heads attend to operands or the operator", "some, but not more than half",
         "none", "", "attention did not run",
         {2: "a majority is more than half, as in rows 2 and 4 (it took 'at least half'); golden case: 2 of 4 "
             "key heads attend to operands or the operator"}),
    Rule(6, "Later MLPs compute the answer (after the layers that gather the operands)", "measurement",
         "per prompt and layer, how much more the MLP writes toward the prompt's own answer than toward the other "
         "prompts' answers (a shuffled-answer null, mlp.json's answer_specific); per prompt its mean over the "
         "later half of the layers (a), and a minus its mean over the earlier half (b); 95% percentile bootstrap "
         "intervals over prompts (seeded)", "- (two intervals, each at 95%)",
         "the intervals of a and of b both above 0", "the interval of a above 0, that of b not",
         "the interval of a not above 0: the later MLPs write the answer no more than other prompts' answers",
         f"fewer than {MIN_PROMPTS} prompts",
         "mlp did not run, or its record has no per-prompt answer_specific (releases before rules v2)",
         {2: "the end layer was the argmax of the answer curve from the inflection on, so 'at or after the "
             "inflection' always held and a positive maximum of noise sufficed; golden cases: a noise-only "
             "curve, and random weights"}),
    Rule(7, "Precise SFT of the key heads improves math about as much as full SFT", "measurement",
         "mean math change against the base row; exact McNemar test of each math benchmark, precise SFT's row "
         "and full SFT's row against the base row", _HOLM_TABLE,
         f"one of precise SFT's tests a significant gain ({_P}) and its mean gain within "
         f"{100 * LIKE_FULL:.0f} points of full SFT's",
         f"one of precise SFT's tests a significant gain, its mean trailing full SFT's by more than "
         f"{100 * LIKE_FULL:.0f} points",
         "no significant gain of precise SFT where full SFT has one",
         "neither row has a significant math gain: there is no gain to match",
         "precise and full SFT were not both run and evaluated, or a row's per-item outcomes are missing",
         {2: "holds needs precise SFT's own significant gain (full SFT's test, even a significant loss, could "
             "meet the 'moved' check); missing per-item files give not measured (they passed as no significant "
             "loss); golden cases: full SFT's significant loss beside precise SFT's non-significant gain, and a "
             "table without per-item files"}),
    Rule(8, "Precise SFT moves generic skills (MMLU, CSQA) less than full SFT", "measurement",
         "KL from the base model on generic text, precise SFT's against full SFT's: one-sided z test on the two "
         "bootstrap intervals (as independent; the rows share items, so it errs toward no difference)",
         "- (one test)", f"precise SFT's KL significantly smaller ({_P})", "",
         "not significantly smaller", "", "the KL of both rows with its interval was not measured",
         {2: "a test of the difference replaces 'the intervals do not overlap'; without the KL the row is not "
             "measured (an accuracy at chance cannot show drift); golden cases: KL 0.10 vs 0.105 with wide "
             "intervals"}),
    Rule(9, "The key heads are a better place to fine-tune than as many random heads", "measurement",
         "math items (every math benchmark, pooled) right after precise SFT against right after SFT of as many "
         "random heads and MLPs, one draw at a time: one-sided exact McNemar test", "Holm over the random draws",
         f"precise SFT significantly better than every draw, over at least {MIN_DRAWS} draws",
         "significantly better than at least one draw, short of holds", "better than no draw",
         "", "no precise run of the random control's size, or no evaluated random draw, or per-item outcomes "
             "missing",
         {2: "each draw is tested item by item against precise SFT (it compared mean changes with the draws' "
             "best); golden cases: a 1-point lead over 3 draws"}),
    Rule(10, "Precise SFT trains faster than full SFT, with far fewer tuned parameters", "descriptive",
         "samples per second of the two runs in the same record, and their tuned parameters; no test (one "
         "timing each)", "-",
         f"at least {PAPER_SPEEDUP:g}x faster (the paper's 'at least threefold') with fewer tuned parameters",
         "faster by less, with fewer tuned parameters", "not faster, or not fewer tuned parameters", "",
         "precise and full SFT did not both run, or their speed was not recorded"),
    Rule(11, "Without the key heads, generic skills (MMLU, CSQA) stay while math drops", "measurement",
         "the key-head knockout row against the base row, item by item: math drops when one of its math tests "
         f"is a significant loss; generic skills stay when, on every generic benchmark where the base model is "
         f"above chance (one-sided exact binomial, {_P}), the change's 95% interval lies above "
         f"-{100 * GENERIC_MARGIN:.0f} points (non-inferiority); the knockout's generic KL is quoted, with no "
         "threshold", _HOLM_TABLE + " (the above-chance tests: one each, unadjusted)",
         "both", "one of the two", "neither",
         "the base model is at chance on every generic benchmark: keeping a skill the model does not have "
         "cannot be tested",
         "no knockout row or no generic benchmark in the evaluation, or per-item outcomes missing",
         {2: "'kept' needs the base model above chance and a non-inferiority margin (|change| <= 5 points passed "
             "at chance); missing per-item files give not measured; golden cases: a base row at chance, and a "
             "-4-point change whose interval reaches -12"}),
)

ABOUT_ARITHMETIC = (4, 5, 6, 7, 9, 11)  # the claims a run of another task skips (see Rule.arithmetic)
RULES = tuple(replace(r, arithmetic=r.row in ABOUT_ARITHMETIC) for r in RULES)
RULE = {r.row: r for r in RULES}
