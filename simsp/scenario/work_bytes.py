"""Bytes a meta run keeps beyond its layer templates' ledger (simsp/scenario/work.py meta_bytes):
an untemplated rank's records (full_bytes) and the spans of `--trace full` (detail_bytes).
Constants and their sources: simsp/scenario/work_constants.py."""

from typing import NamedTuple

from simsp.scenario.work_constants import (
    BYTES_PER_MERGED_SPAN, BYTES_PER_SPAN, BYTES_PER_TRANSFER_RECORD, FULL_BYTES_PER_RANK,
    FULL_BYTES_PER_RANK_LAYER, FULL_BYTES_PER_RANK_STEP, FULL_BYTES_PER_RING_STEP)


class DetailSpans(NamedTuple):
    """The spans `--trace full` adds to `steps` (the compute and TP-communication tracks,
    engine/trace.py DETAIL_TRACKS), counted on one layer's program before the run
    (training/driver/trace_counts.py): per rank-step untemplated (every kernel and TP
    collective of the layer's forward, backward and recompute), per rank-step templated (one
    merged span per detail track of each replayed forward and backward, model/replay.py), per
    rank-layer (the sequence-parallel gradients' all-reduces after the schedule)."""

    per_step: float  # a mean over the layers' kinds where they differ (an int where alike)
    merged_per_step: float
    per_layer: float


def detail_bytes(sc, detail: DetailSpans | None, templates: bool, rank_steps: int,
                 ranks: int) -> int:
    """Bytes of the spans `--trace full` adds (DetailSpans): each its own args dict, but a
    template's merged spans, which share their template's."""
    if detail is None:
        return 0
    rank_layers = ranks * sc.model.num_layers // sc.parallel.pp
    own = rank_layers * detail.per_layer + (0 if templates else rank_steps * detail.per_step)
    merged = rank_steps * detail.merged_per_step if templates else 0
    return round(own * BYTES_PER_SPAN + merged * BYTES_PER_MERGED_SPAN)


def full_bytes(sc, rank_steps: int, ranks: int, records: int = 0) -> int:
    """Bytes the simulated ranks keep beside their plans where they run untemplated (every
    rank without the representative): every rank-step's ledger records (each allocation and
    free of the layer, untemplated) and trace spans; every rank-step's TP ring steps' transfer
    records (t − 1 a ring collective, network.py keeps every delivered transfer); the
    data-parallel rings' `records` (shortcuts/record_counts.py); every rank's state of each of
    its stage's layers (parameters, gradients, optimizer) and its own (its rank, ledger,
    program)."""
    p = sc.parallel
    ring_steps = rank_steps * (p.tp - 1)
    rank_layers = ranks * sc.model.num_layers // p.pp
    return (rank_steps * FULL_BYTES_PER_RANK_STEP + ring_steps * FULL_BYTES_PER_RING_STEP
            + records * BYTES_PER_TRANSFER_RECORD
            + rank_layers * FULL_BYTES_PER_RANK_LAYER + ranks * FULL_BYTES_PER_RANK)


