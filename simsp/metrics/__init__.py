"""Metrics of one simulated iteration: pure functions of its trace, ledgers and step records
(collect.py gathers them into `simsp run`'s metrics)."""
