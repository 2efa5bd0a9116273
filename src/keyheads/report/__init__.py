"""Figures and tables shared by the analysis commands."""
