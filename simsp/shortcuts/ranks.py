"""A large group's ranks hashed once: the check's owners as keys of many dicts and sets.

The shortcut check (shortcuts/check.py) keys links' users, clashes and methods by owner, an
owner being (kind, ranks). A tuple's hash is worked out anew at every lookup, O(members), so a
d-member DP ring met on O(d) links cost O(d²) per ring (DeepSeek-V3 at 8,192 GPUs: 512-member
rings). `Ranks` is the same tuple (equal to it, the same hash) with its hash kept after the first
and membership tested by a set.
"""

from functools import cached_property

# below this many ranks the tuple's own C hash and scan cost less than a Python-level call:
# timeit on this machine (2026-11-29, q46d), a dict lookup keyed by a 2 / 8 / 16 / 64 / 512-rank
# tuple 0.09 / 0.10 / 0.17 / 0.51 / 3.2 µs, by the same Ranks 0.18 / 0.21 / 0.16 / 0.16 / 0.17;
# `rank in` 0.20 / 0.37 µs at 8 / 16 ranks as a tuple, 0.23 / 0.26 as Ranks
MIN_RANKS = 16


class Ranks(tuple):
    """A tuple of ranks that hashes once and answers `rank in` by a set."""

    @cached_property
    def _hash(self) -> int:
        return tuple.__hash__(self)

    @cached_property
    def members(self) -> frozenset[int]:
        """The ranks as a set."""
        return frozenset(self)

    def __hash__(self) -> int:
        return self._hash

    def __contains__(self, rank) -> bool:
        return rank in self.members


def hashed_once(owners: list) -> list:
    """The owners [(kind, ranks)] with every group of at least MIN_RANKS ranks as `Ranks`."""
    return [(kind, Ranks(ranks) if len(ranks) >= MIN_RANKS else ranks) for kind, ranks in owners]
