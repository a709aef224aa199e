"""Exploration: many configurations in, one simulated iteration each, a results table out.

configs (grid of comma lists, sweep files, search layouts) -> evaluate (simulate + metrics, one
row) -> executor (Dask, or this process) with a resumable cache -> table (pandas DataFrame).
"""
