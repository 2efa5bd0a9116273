"""Validate and explain key components: knockout curves, transfer, attention patterns, MLP probes."""
