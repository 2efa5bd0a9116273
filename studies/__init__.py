"""The study scripts: findings, tables and pages from run folders and records, run as `python -m studies.NAME`."""
