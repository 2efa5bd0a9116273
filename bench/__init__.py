"""Speed and memory benchmarks of keyheads' steps, each run from the repository's root as `python -m bench.NAME`."""
