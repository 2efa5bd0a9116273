"""MIB's faithfulness of a circuit: its definitions (curve.py) and their measurement on a model (run.py)."""
from .curve import PERCENTAGES, Curve, areas, normalised, ranked, sizes

__all__ = ["PERCENTAGES", "Curve", "areas", "normalised", "ranked", "sizes"]
