"""Data: reference/counterfactual prompt pairs (pairs.py, templates) and benchmark loaders (benchmarks.py)."""
