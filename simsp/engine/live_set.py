"""The tensors live on one rank now, by key (issue 9: a replayed layer step's 60-74 changes
must not cost 60-74 Python-level steps).

A single allocation is a LiveTensor. A replayed step's surviving tensors share one precomputed
BlockEntry per relative key (category, bytes, op), so applying a block is two C-level bulk
operations on the dict: delete the keys it frees, insert the keys it leaves live.
"""

from collections import deque

from simsp.engine.memory_summary import LiveTensor
from simsp.engine.op_block import BlockEntry, OpBlock, resolve

_new = tuple.__new__  # skips NamedTuple's Python-level constructor on the hot path


def _as_tensor(key: str, entry) -> LiveTensor:
    return entry if type(entry) is LiveTensor else LiveTensor(key, *entry)


class LiveSet:
    """Live tensors of one rank: {key: LiveTensor or BlockEntry}, both with category and
    nbytes."""

    def __init__(self):
        self._entries: dict[str, LiveTensor | BlockEntry] = {}

    def holds(self, key: str) -> bool:
        """Whether a tensor of this key is live."""
        return key in self._entries

    def add(self, key: str, category: str, nbytes: int, op: str) -> None:
        """A new single tensor; a key already live is an error."""
        if key in self._entries:
            raise KeyError(f"tensor {key!r} allocated twice")
        self._entries[key] = _new(LiveTensor, (key, category, nbytes, op))

    def get(self, key: str) -> LiveTensor:
        """The live tensor of `key` (KeyError if none)."""
        return _as_tensor(key, self._entries[key])

    def pop(self, key: str) -> LiveTensor | BlockEntry:
        """Remove the live tensor of `key` and return its entry (KeyError if none)."""
        return self._entries.pop(key)

    def free_block(self, block: OpBlock, scope: str) -> None:
        """Remove the tensors a block frees (relative keys under `scope`, its input excluded)."""
        deque(map(self._entries.__delitem__, map(scope.__add__, block.free_set_in_order)),
              maxlen=0)

    def add_block(self, block: OpBlock, scope: str, input_key: str) -> None:
        """Add the tensors a block leaves live; a key already live is an error."""
        entries = self._entries
        if block.input_realloc:  # rare: the block allocates its input's key again
            for rel, category, nbytes, op in block.net_allocs:
                self.add(resolve(rel, scope, input_key), category, nbytes, op)
            return
        before = len(entries)
        entries.update(zip(map(scope.__add__, block.alloc_rels), block.alloc_entries))
        if len(entries) != before + len(block.alloc_rels):
            raise KeyError(f"a tensor of block scope {scope!r} allocated twice")

    def as_dict(self) -> dict[str, LiveTensor]:
        """Every live tensor by key: for reports and tests, not the hot path."""
        return {key: _as_tensor(key, entry) for key, entry in self._entries.items()}

    def __len__(self) -> int:
        return len(self._entries)
