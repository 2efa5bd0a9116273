"""MIB's faithfulness of a circuit, as its circuit track defines it (hannamw/MIB-circuit-track,
evaluate_graph.py, `evaluate_area_under_curve`), with no torch: the circuit sizes, the normalised score and the two
areas. keyheads.faithfulness.run measures the scores on a model.

- A circuit of n components keeps the n highest-scored ones (by |score| when `absolute`, MIB's default), where
  n = int(pct * n_scored) for each of MIB's percentages.
- Its faithfulness is f(C) = (m(C) - m(empty)) / (m(N) - m(empty)): m is the task metric averaged over the items, C
  runs with everything outside it ablated, N is the whole model unablated and the empty circuit ablates every
  scored component.
- CPR ("area under") is the trapezoid area under f over the percentages, CMD ("area from 100") the trapezoid area
  of |1 - f|; both on a linear axis, as MIB computes them (its `log_scale` flag changes no width).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# MIB's circuit sizes, as fractions of the scored components (its `percentages`)
PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def sizes(n_scored: int, percentages: tuple[float, ...] = PERCENTAGES) -> list[int]:
    """How many components each circuit keeps: int(pct * n_scored), as MIB rounds (down)."""
    return [int(pct * n_scored) for pct in percentages]


def normalised(m: float, m_full: float, m_empty: float) -> float:
    """f(C) = (m(C) - m(empty)) / (m(N) - m(empty)); NaN when ablating everything changes nothing."""
    span = m_full - m_empty
    return (m - m_empty) / span if span != 0 else math.nan


def areas(f: list[float], percentages: tuple[float, ...] = PERCENTAGES) -> tuple[float, float]:
    """(CPR, CMD): the trapezoid areas under f and between f and 1 over the percentages."""
    if len(f) != len(percentages):
        raise ValueError(f"{len(f)} faithfulness scores for {len(percentages)} circuit sizes")
    under = from_one = 0.0
    for i in range(len(f) - 1):
        width = percentages[i + 1] - percentages[i]
        under += width * (f[i] + f[i + 1]) / 2
        from_one += width * (abs(1 - f[i]) + abs(1 - f[i + 1])) / 2
    return under, from_one


def ranked(scores: dict[str, float], absolute: bool = True) -> list[str]:
    """Component names, highest score first (|score| when `absolute`); unscored (NaN) ones left out, ties in the
    given order."""
    scored = [(name, v) for name, v in scores.items() if not math.isnan(v)]
    key = (lambda item: -abs(item[1])) if absolute else (lambda item: -item[1])
    return [name for name, _ in sorted(scored, key=key)]


@dataclass
class Curve:
    """A circuit's faithfulness at MIB's sizes, with what it was measured from.

    m_full, m_empty: the metric of the whole model and of the empty circuit; m: of each circuit; f: normalised.
    """

    level: str           # "node": components are heads and MLPs
    ablation: str        # counterfactual | mean
    metric: str          # the per-item quantity m averages
    absolute: bool       # ranked by |score|
    n_items: int
    n_scored: int
    percentages: list[float]
    sizes: list[int]
    m_full: float
    m_empty: float
    m: list[float]
    f: list[float]
    cpr: float
    cmd: float
    circuits: list[list[str]]  # the components each circuit kept, highest score first

    @classmethod
    def of(cls, m_full: float, m_empty: float, m: list[float], circuits: list[list[str]], **facts) -> Curve:
        f = [normalised(v, m_full, m_empty) for v in m]
        cpr, cmd = areas(f, tuple(facts["percentages"]))
        return cls(m_full=m_full, m_empty=m_empty, m=m, f=f, cpr=cpr, cmd=cmd, circuits=circuits, **facts)

    def to_json(self) -> dict:
        return asdict(self)
