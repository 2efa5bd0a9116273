"""`keyheads plan`: what each stage and method needs per GPU, from the model's config alone.

- shape: the config (no weights) and the parameter counts of a model built on the meta device;
- costs: the bytes per parameter and per token, each constant with where it comes from;
- planner: the parallel modes, which one fits, and the flags that choose it.
"""
