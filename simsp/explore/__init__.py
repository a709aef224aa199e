"""Exploration: many configurations in, one simulated iteration each, a results table out.

configs/ (the field table, comma-list grids, sweep files, world sizes: Config) -> evaluation/
(one row per Config: evaluate; many: runner on the executor, with the resumable cache and the
work limits) -> results/ (the table, headroom against the memory reserve, result folders).
`simsp sweep` is that pipeline alone; search/ (layouts, proven bounds, branch and bound) and
whatif/ (variants against a baseline, out-of-memory advice) build on it. arguments.py holds the
command-line flags the three commands share. search/ and whatif/ use configs/, evaluation/ and
results/, never each other.
"""
