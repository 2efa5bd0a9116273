"""The statistics of comparing two rows that answered the same items, item by item.

One row (a fine-tuned or knocked-out variant) against a reference row (the base model) on the same n
items of a benchmark. Each item falls in one of four cells: right in both, right only in the row
(gained), right only in the reference (lost), wrong in both.

- The test is the two-sided exact McNemar test: under "no difference" each disagreeing item is as likely
  gained as lost, so min(gained, lost) is Binomial(gained + lost, 1/2) (scipy's binomtest).
- The effect is the paired difference in accuracy, row minus reference, (gained - lost) / n, with its
  95% interval by Newcombe's (1998) method 10: the Wilson score intervals of the two accuracies
  (statsmodels' proportion_confint), combined square-and-add with a correction for their correlation
  (the phi coefficient of the 2x2 table). It needs the whole 2x2 table, so the reference's right count
  is an input besides gained, lost and n. Method 10 is the default of statsmodels' own
  confint_proportions_paired in its development documentation, which no release has yet (0.15.0 lacks
  it): when one does, it can replace `newcombe_paired`. Unlike the Wald interval (Newcombe's method 1),
  it does not shrink to zero width when no item changed, and it stays within [-1, 1].
- A table of such tests is one family: `holm` adjusts their p values by Holm's step-down method
  (statsmodels' multipletests), so that "p < 0.05" holds for the whole table, not for each cell alone.
- Controls drawn at random (random heads knocked out or fine-tuned) are run with several seeds where
  time allows: `seed_groups` finds the names that differ only in a seed, `band` gives their mean and range.

Nothing here imports torch: the report and the bench scripts both use it.
"""
from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

ALPHA = 0.05


def mcnemar_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p: the items where the two rows disagree, tested against a fair coin."""
    if gained + lost == 0:
        return 1.0
    from scipy.stats import binomtest  # noqa: PLC0415 -- loaded on use, see pyproject

    return float(binomtest(min(gained, lost), gained + lost, 0.5).pvalue)


def newcombe_paired(a: int, b: int, c: int, d: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The (1 - alpha) interval of p1 - p2 = (b - c) / n for the paired 2x2 table [[a, b], [c, d]]
    (a: both right; b: right in the first only; c: right in the second only; d: both wrong), by
    Newcombe's (1998) method 10, without continuity correction."""
    n = a + b + c + d
    if n <= 0 or min(a, b, c, d) < 0:
        raise ValueError(f"not a 2x2 table of counts: {(a, b, c, d)}")
    p1, p2 = (a + b) / n, (a + c) / n
    from statsmodels.stats.proportion import proportion_confint  # noqa: PLC0415

    l1, u1 = (float(x) for x in proportion_confint(a + b, n, alpha=alpha, method="wilson"))
    l2, u2 = (float(x) for x in proportion_confint(a + c, n, alpha=alpha, method="wilson"))
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(margins) if margins else 0.0
    diff = p1 - p2
    below = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    above = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    return diff - math.sqrt(max(below, 0.0)), diff + math.sqrt(max(above, 0.0))


@dataclass(frozen=True)
class PairedTest:
    """A row against its reference on the same n items."""

    gained: int                    # right in the row only
    lost: int                      # right in the reference only
    n: int                         # items
    reference_right: int           # items the reference got right
    p: float                       # two-sided exact McNemar p
    delta: float                   # row minus reference accuracy, a fraction
    ci: tuple[float, float]        # its 95% interval (Newcombe method 10)
    p_holm: float | None = None    # p adjusted over the table's family (holm), once known

    @property
    def significant(self) -> bool:
        """Holm-adjusted p below 0.05 (the raw p when no family was given)."""
        return (self.p if self.p_holm is None else self.p_holm) < ALPHA

    def effect(self) -> str:
        """'Δ +12.0 [+3.0, +20.4]': the change in points and its 95% interval."""
        return f"Δ {_points(self.delta)} [{_points(self.ci[0])}, {_points(self.ci[1])}]"

    def cell(self) -> str:
        """'+6 / -0, Δ +12.0 [+3.0, +20.4], p 0.031 (Holm 1)' (6 items gained, none lost, of 50 the
        reference got 24 of; Holm over its table)."""
        holm_p = "" if self.p_holm is None else f" (Holm {fmt_p(self.p_holm)})"
        return f"+{self.gained} / -{self.lost}, {self.effect()}, p {fmt_p(self.p)}{holm_p}"


def paired_test(gained: int, lost: int, n: int, reference_right: int) -> PairedTest:
    """The McNemar p, the change in accuracy and its 95% interval of a row that got `gained` items right
    that the reference got wrong and `lost` the other way, on `n` items the reference got
    `reference_right` of."""
    both_right = reference_right - lost
    both_wrong = n - reference_right - gained
    if min(gained, lost, both_right, both_wrong) < 0:
        raise ValueError(f"inconsistent counts: gained {gained}, lost {lost}, reference right {reference_right} "
                         f"of {n}")
    lo, hi = newcombe_paired(both_right, gained, lost, both_wrong)
    return PairedTest(gained, lost, n, reference_right, mcnemar_p(gained, lost), (gained - lost) / n, (lo, hi))


def paired_sets(reference_wrong: set[str], row_wrong: set[str], n: int) -> PairedTest:
    """paired_test from the ids of the items each row got wrong, of the same n items."""
    if len(reference_wrong | row_wrong) > n:
        raise ValueError(f"{len(reference_wrong | row_wrong)} items wrong in one row or the other, of {n}")
    return paired_test(len(reference_wrong - row_wrong), len(row_wrong - reference_wrong), n,
                       n - len(reference_wrong))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p values, in their order (family-wise error 0.05)."""
    if not pvalues:
        return []
    from statsmodels.stats.multitest import multipletests  # noqa: PLC0415

    return [float(p) for p in multipletests(list(pvalues), alpha=ALPHA, method="holm")[1]]


def with_holm(tests: dict) -> dict:
    """The same {key: PairedTest}, each with its p adjusted by Holm over all of them."""
    keys = list(tests)
    adjusted = holm([tests[k].p for k in keys])
    return {k: replace(tests[k], p_holm=p) for k, p in zip(keys, adjusted)}


def fmt_p(p: float) -> str:
    return f"{p:.2g}"


def _points(x: float) -> str:
    s = f"{100 * x:+.1f}"
    return "+0.0" if s == "-0.0" else s


# ---- several seeds of one random control ----------------------------------------------------------
SEED = re.compile(r"[\s_,-]*[(\[]?(?<![A-Za-z])seed[\s_=-]*\d+[)\]]?", re.IGNORECASE)


def seed_free(name: str) -> str:
    """`name` without its seed: 'random@40-seed2' and 'random@40' -> 'random@40'."""
    return SEED.sub("", name).strip()


def has_seed(name: str) -> bool:
    return SEED.search(name) is not None


def seed_groups(names: Sequence[str]) -> dict[str, list[int]]:
    """{name without seed: indices of `names`} for every set of two or more names that differ only in a
    seed, at least one of which names one (`random@40`, `random@40-seed1`, `random@40 (seed 2)`)."""
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        groups.setdefault(seed_free(name), []).append(i)
    return {k: v for k, v in groups.items() if len(v) > 1 and any(has_seed(names[i]) for i in v)}


@dataclass(frozen=True)
class Band:
    """Mean and range of one quantity over the seeds of a random control."""

    mean: float
    low: float
    high: float
    count: int

    def text(self, scale: float = 100.0, signed: bool = True) -> str:
        f = "+.1f" if signed else ".1f"
        return (f"mean {scale * self.mean:{f}}, range {scale * self.low:{f}} to {scale * self.high:{f}} "
                f"over {self.count} seeds")


def band(values: Sequence[float]) -> Band:
    if not values:
        raise ValueError("a band needs at least one value")
    return Band(statistics.fmean(values), min(values), max(values), len(values))


# ---- the tests the verdict rules use besides McNemar (keyheads.report.rules names which row uses which) ----------

def mcnemar_greater_p(gained: int, lost: int) -> float:
    """One-sided exact McNemar p that the row is better than its reference: of the items the two rows disagree on,
    `gained` or more right in the row alone, against a fair coin."""
    if gained + lost == 0:
        return 1.0
    from scipy.stats import binomtest  # noqa: PLC0415

    return float(binomtest(gained, gained + lost, 0.5, alternative="greater").pvalue)


def fisher_fewer_p(right_a: int, n_a: int, right_b: int, n_b: int) -> float:
    """One-sided Fisher exact p that group a answers right less often than group b (right_a of n_a, right_b of n_b).
    Unpaired: a knockout record keeps counts, not which prompts each knockout got right, so the test ignores the
    pairing and is conservative where the two share prompts."""
    from scipy.stats import fisher_exact  # noqa: PLC0415

    table = [[right_a, n_a - right_a], [right_b, n_b - right_b]]
    return float(fisher_exact(table, alternative="less").pvalue)


def above_chance_p(right: int, n: int, chance: float) -> float:
    """One-sided exact binomial p that an accuracy of right / n is above `chance`."""
    from scipy.stats import binomtest  # noqa: PLC0415

    return float(binomtest(right, n, chance, alternative="greater").pvalue) if n > 0 else 1.0


def smaller_p(x: float, ci_x: Sequence[float], y: float, ci_y: Sequence[float]) -> float:
    """One-sided p that x < y, from each one's estimate and 95% interval (their bootstrap intervals, read as normal:
    se = width / 3.92), as if independent; the two share items, so this errs toward not telling them apart."""
    from scipy.stats import norm  # noqa: PLC0415

    se = math.hypot((ci_x[1] - ci_x[0]) / 3.92, (ci_y[1] - ci_y[0]) / 3.92)
    if not se > 0:
        return 0.0 if x < y else 1.0
    return float(norm.sf((y - x) / se))


BOOTSTRAP_RESAMPLES = 2000


def bootstrap_mean_ci(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the mean of `values` (prompts resampled with replacement; seeded,
    so the same values give the same interval)."""
    import numpy as np  # noqa: PLC0415
    from scipy.stats import bootstrap  # noqa: PLC0415

    data = np.asarray(values, dtype=float)
    if len(data) < 2 or np.all(data == data[0]):
        return float(data.mean()), float(data.mean())
    res = bootstrap((data,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=0.95, method="percentile",
                    rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


# ---- how many items a paired test needs ---------------------------------------------------------------------------

DETECT = 0.10  # the paired difference an evaluation set is sized to detect: 10 accuracy points
POWER = 0.8


def mcnemar_items(base_accuracy: float, delta: float = DETECT, power: float = POWER, alpha: float = ALPHA) -> int:
    """Items a two-sided McNemar test at `alpha` needs to detect a change of `delta` in accuracy from
    `base_accuracy` with probability `power` (Connor's 1987 normal approximation, n = (z_a sqrt(psi) + z_b
    sqrt(psi - delta^2))^2 / delta^2). The discordant share psi is taken as if the row's answers were independent
    of the base row's given their accuracies, p(1 - q) + q(1 - p): rows of one model agree more than that, so the
    true need is smaller and this errs on the side of more items."""
    from scipy.stats import norm  # noqa: PLC0415

    p = min(max(base_accuracy, 0.0), 1.0)
    q = min(p + delta, 1.0) if p + delta <= 1.0 else max(p - delta, 0.0)
    d = abs(q - p)
    if d == 0:
        raise ValueError(f"no change of {delta} is possible from accuracy {base_accuracy}")
    psi = p * (1 - q) + q * (1 - p)
    za, zb = norm.ppf(1 - alpha / 2), norm.ppf(power)
    return math.ceil((za * math.sqrt(psi) + zb * math.sqrt(max(psi - d * d, 0.0))) ** 2 / (d * d))
