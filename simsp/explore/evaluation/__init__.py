"""Configurations to result rows: one in this process (evaluate, flatten), many on Dask or
here (executor, runner), resumable (cache), bounded before anything starts (limits), printed
in order as they finish (stream)."""
