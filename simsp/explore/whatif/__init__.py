"""Variants against a baseline: `simsp whatif`'s variants and ranking (variants), and the switches
that bring an out-of-memory `simsp run` under capacity, each simulated (oom_advice)."""
