"""A block of ledger changes recorded once and applied many times (a replayed layer step).

The ledger logs an applied block as one record (start time, block, key scope, input key); the
block holds what expanding that record needs: each change's time offset, category, signed bytes,
relative key and op, as numpy columns for the summaries and as names for the reports that need
them. It also holds the block's net effect on the live tensors, so applying it touches only the
tensors that outlive it.
"""

from typing import NamedTuple

import numpy as np


INPUT = "<input>"  # relative key of the step's input tensor, allocated outside the block's scope


class BlockOp(NamedTuple):
    """One ledger change of a block, relative to the block's start time and key scope."""

    offset_s: float
    delta_bytes: int
    key: str  # relative to the scope, or INPUT
    category: str
    op: str


class BlockEntry(NamedTuple):
    """A live tensor a replayed block leaves behind (live_set.py); its key is absolute
    only once applied, so the entry holds the rest."""

    category: str
    nbytes: int
    op: str


def resolve(rel: str, scope: str, input_key: str) -> str:
    """The absolute ledger key of a block's relative key."""
    return input_key if rel == INPUT else scope + rel


class OpBlock:
    """Immutable: the changes of one recorded step and their net effect on the live tensors."""

    def __init__(self, ops: tuple, categories: tuple):
        """`ops`: (offset_s, delta_bytes, relative key, category, op) in recording order."""
        self.ops = tuple(BlockOp(*op) for op in ops)
        self.categories = categories
        code = {c: i for i, c in enumerate(categories)}
        self.size = len(self.ops)
        self.offsets = np.array([op.offset_s for op in self.ops], dtype=float)  # (k,)
        self.codes = np.array([code[op.category] for op in self.ops], dtype=np.int64)  # (k,)
        self.deltas = np.array([op.delta_bytes for op in self.ops], dtype=np.int64)  # (k,)
        self.net_frees, self.net_allocs = _net_live_changes(self.ops)
        self.free_set_in_order = tuple(rel for rel in self.net_frees if rel != INPUT)
        self.input_realloc = any(rel == INPUT for rel, *_ in self.net_allocs)
        self.alloc_rels = tuple(rel for rel, *_ in self.net_allocs)
        self.alloc_entries = tuple(BlockEntry(category, nbytes, op)
                                   for _, category, nbytes, op in self.net_allocs)
        self.alloc_entry_of = dict(zip(self.alloc_rels, self.alloc_entries))
        self.alloc_set = frozenset(self.alloc_rels)
        self.free_set = frozenset(self.free_set_in_order)
        # live tensors kept as one group under the scope (live_set.py): several, and
        # keys that split at the scope's last "."
        self.groupable = (len(self.alloc_rels) > 1 and not self.input_realloc
                          and not any("." in rel for rel in self.alloc_rels))
        self.input_free = _input_free(self.ops)  # index of the input's free, or None
        net = dict.fromkeys(categories, 0)
        for i, op in enumerate(self.ops):
            if i != self.input_free:
                net[op.category] += op.delta_bytes
        self.net_by_category = tuple((c, b) for c, b in net.items() if b)


def _input_free(ops: tuple) -> int | None:
    """Index of the change freeing the step's input tensor (allocated before the block)."""
    for i, op in enumerate(ops):
        if op.key == INPUT:
            return i if op.delta_bytes < 0 else None  # freed after a local alloc: not the input
    return None


def _net_live_changes(ops: tuple) -> tuple[tuple, tuple]:
    """(relative keys freed that the block did not allocate, allocations still live at its end).

    Applying the frees first and then the allocations leaves the live tensors exactly as
    applying every change in order would (a key freed and re-allocated appears in both)."""
    local, frees = {}, []
    for op in ops:
        if op.delta_bytes > 0:
            local[op.key] = (op.key, op.category, op.delta_bytes, op.op)
        elif op.key in local:
            del local[op.key]
        else:
            frees.append(op.key)
    return tuple(frees), tuple(local.values())
