"""Calibration from measurements: nccl-tests logs -> link parameters of the [cluster] section.

nccl_log reads nccl-tests output; layout turns its ranks and hosts into simsp's ring; link_model
prices it with the engine's own collective timing; fit does the least squares; fragment writes
the TOML.
"""
