"""The tensors live on one rank now, by key (docs/PERFORMANCE.md: a replayed layer step's
60-74 changes must not cost 60-74 Python-level steps).

A single allocation is a LiveTensor in a dict by key. The tensors a replayed step leaves live
are one group under the step's key scope: its block and the relative keys freed since, so a
forward leaving 13 tensors and the backward freeing them are one dict operation each. A key
is found in its group by splitting it at its last "." (grouped blocks' relative keys hold
none, their scopes end in one). Any other block's tensors are entered one by one.
"""

from simsp.engine.memory.op_block import OpBlock, resolve
from simsp.engine.memory.summary import LiveTensor


_new = tuple.__new__  # skips NamedTuple's Python-level constructor on the hot path


class AlreadyLive(KeyError):
    """A tensor was allocated under a key that is live already."""


class _Group:
    """The tensors one applied block left live under its scope, less those freed since."""

    __slots__ = ("block", "gone")

    def __init__(self, block: OpBlock):
        self.block = block
        self.gone: set[str] = set()  # relative keys freed one by one since

    def holds(self, rel: str) -> bool:
        """Whether the block's tensor `rel` is still live."""
        return rel in self.block.alloc_set and rel not in self.gone

    def size(self) -> int:
        """How many of the block's tensors are still live."""
        return len(self.block.alloc_rels) - len(self.gone)


class LiveSet:
    """Live tensors of one rank: single tensors by key, and applied blocks' groups by scope."""

    def __init__(self):
        self._entries: dict[str, LiveTensor] = {}
        self._groups: dict[str, _Group] = {}  # scope -> what its block left live
        self._single_scopes: set[str] = set()  # key[:last "." + 1] of every single ever added
        self._grouped = 0  # tensors live in groups

    def holds(self, key: str) -> bool:
        """Whether a tensor of this key is live."""
        return key in self._entries or self._group_of(key) is not None

    def add(self, key: str, category: str, nbytes: int, op: str) -> None:
        """A new single tensor; a key already live is an error."""
        cut = key.rfind(".") + 1
        scope = key[:cut]
        group = self._groups.get(scope)
        if key in self._entries or group is not None and group.holds(key[cut:]):
            raise AlreadyLive(f"tensor {key!r} allocated twice")
        self._single_scopes.add(scope)
        self._entries[key] = _new(LiveTensor, (key, category, nbytes, op))

    def get(self, key: str) -> LiveTensor:
        """The live tensor of `key` (KeyError if none)."""
        tensor = self._entries.get(key)
        if tensor is not None:
            return tensor
        group, rel = self._found(key)
        return LiveTensor(key, *group.block.alloc_entry_of[rel])

    def pop(self, key: str) -> LiveTensor:
        """Remove the live tensor of `key` and return it (KeyError if none)."""
        tensor = self._entries.pop(key, None)
        if tensor is not None:
            return tensor
        group, rel = self._found(key)
        self._drop(key[:len(key) - len(rel)], group, (rel,))
        return _new(LiveTensor, (key, *group.block.alloc_entry_of[rel]))

    def free_block(self, block: OpBlock, scope: str) -> None:
        """Remove the tensors a block frees (relative keys under `scope`, its input excluded)."""
        group = self._groups.get(scope)
        frees = block.free_set
        if group is not None and frees <= group.block.alloc_set and group.gone.isdisjoint(frees):
            self._drop(scope, group, frees)
            return
        for rel in block.free_set_in_order:  # not one group's: key by key
            self.pop(scope + rel)

    def add_block(self, block: OpBlock, scope: str, input_key: str) -> None:
        """Add the tensors a block leaves live; a key already live is an error."""
        if block.groupable and scope.endswith(".") and scope not in self._groups:
            if scope in self._single_scopes:  # a single under this scope could collide
                self._check_free(block, scope)
            self._groups[scope] = _Group(block)
            self._grouped += len(block.alloc_rels)
            return
        for rel, category, nbytes, op in block.net_allocs:
            self.add(resolve(rel, scope, input_key), category, nbytes, op)

    def as_dict(self) -> dict[str, LiveTensor]:
        """Every live tensor by key: for reports and tests, not the hot path."""
        live = dict(self._entries)
        for scope, group in self._groups.items():
            for rel, entry in group.block.alloc_entry_of.items():
                if rel not in group.gone:
                    live[scope + rel] = LiveTensor(scope + rel, *entry)
        return live

    def __len__(self) -> int:
        return len(self._entries) + self._grouped

    def _group_of(self, key: str) -> _Group | None:
        """The group holding `key` live, if any."""
        return self._split(key)[0] if self._groups else None

    def _found(self, key: str) -> tuple[_Group, str]:
        """(group, relative key) of a grouped live key; KeyError if it is not live."""
        group, rel = self._split(key)
        if group is None:
            raise KeyError(key)
        return group, rel

    def _split(self, key: str) -> tuple[_Group | None, str]:
        """(the group holding `key` live or None, its relative key): cut at the last "."."""
        cut = key.rfind(".") + 1
        group = self._groups.get(key[:cut])
        rel = key[cut:]
        return (group if group is not None and group.holds(rel) else None), rel

    def _drop(self, scope: str, group: _Group, rels) -> None:
        """Free live relative keys `rels` (distinct) of the group under `scope`."""
        self._grouped -= len(rels)
        if len(rels) == group.size():  # the last of them: the group goes
            del self._groups[scope]
        else:
            group.gone.update(rels)

    def _check_free(self, block: OpBlock, scope: str) -> None:
        """AlreadyLive if a key the block leaves live is live as a single tensor."""
        for rel in block.alloc_rels:
            if scope + rel in self._entries:
                raise AlreadyLive(f"a tensor of block scope {scope!r} allocated twice")
