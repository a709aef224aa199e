"""Memory snapshots of chosen ranks, as `torch.cuda.memory._dump_snapshot` writes them, so that
PyTorch's memory visualizer (pytorch.org/memory_viz, or `python -m torch.cuda._memory_viz
trace_plot`) opens simsp's timeline (docs/allocator.md#a-ranks-ledger-through-the-allocator).

Each rank's ledger is replayed through the caching allocator with its trace recorded; frames
name the model site (micro-batch, layer, tensor) and the category the ledger files it under.
"""

from pathlib import Path

from simsp.engine.allocator.ledger_stream import replay_ledger
from simsp.engine.allocator.snapshot import build_snapshot, write_snapshot
from simsp.metrics.memory import ledger_of


def snapshot_name(rank: int) -> str:
    """The file of one rank's snapshot inside the report folder."""
    return f"memory_snapshot_rank{rank}.pickle"


def rank_snapshot(run, rank: int) -> dict:
    """The snapshot dict of one rank (a rank not simulated: its identical representative's
    ledger) through the caching allocator, its trace recorded."""
    return build_snapshot(replay_ledger(ledger_of(run, rank), record_trace=True).allocator)


def write_memory_snapshots(run, ranks: list[int], out_dir: Path) -> list[Path]:
    """One snapshot per rank in `ranks` (a rank not simulated: its identical representative's
    ledger), written into `out_dir`; the paths written."""
    written = []
    for rank in ranks:
        path = out_dir / snapshot_name(rank)
        write_snapshot(path, rank_snapshot(run, rank))
        written.append(path)
    return written
