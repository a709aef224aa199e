"""Each communication span of a full trace says what hid it: `hidden_s`, the seconds of the
span during which the same rank's compute stream ran a kernel, and `behind`, the first and last
of those kernels ("" when none ran). docs/overlaps.md.

The compute stream's kernels are merged into busy intervals once per rank; the busy time up to
any instant is then a lookup (a cumulative sum and a binary search), so annotating n spans over
k kernels costs O((n + k) log k).
"""

import numpy as np

from simsp.engine.trace import Span

COMPUTE = "compute"


def is_communication(track: str) -> bool:
    """Whether spans on `track` are communication (tp_comm, pp_comm, dp_comm, cp_comm...)."""
    return track.endswith("_comm")


class BusyTime:
    """When one rank's compute stream ran a kernel: the union of its kernels' spans."""

    def __init__(self, kernels: list[Span]):
        kernels = sorted(kernels, key=lambda s: (s.start_s, s.end_s))
        self.names = [s.name for s in kernels]
        self.start = np.array([s.start_s for s in kernels], dtype=float)  # (k,) sorted
        self.reach = np.maximum.accumulate(np.array([s.end_s for s in kernels], dtype=float)) \
            if kernels else np.zeros(0)  # (k,) latest end among kernels 0..i
        opens = np.ones(len(kernels), dtype=bool)  # (k,) kernel i starts a busy interval
        opens[1:] = self.start[1:] > self.reach[:-1]
        first = np.flatnonzero(opens)  # (u,) kernel opening each busy interval
        last = np.append(first[1:] - 1, len(kernels) - 1).astype(np.int64)  # (u,)
        self.lo = self.start[first]  # (u,) busy interval starts
        self.hi = self.reach[last] if len(kernels) else np.zeros(0)  # (u,) their ends
        self.before = np.concatenate(([0.0], np.cumsum(self.hi - self.lo)))  # (u + 1,)

    def up_to(self, t: np.ndarray) -> np.ndarray:
        """Busy seconds in (-inf, t] for each instant t (n,)."""
        k = np.searchsorted(self.lo, t, side="right") - 1  # (n,) last interval opened by t
        inside = np.clip(t - self.lo[np.maximum(k, 0)], 0.0,
                         (self.hi - self.lo)[np.maximum(k, 0)]) if len(self.lo) else 0.0
        return np.where(k >= 0, self.before[np.maximum(k, 0)] + inside, 0.0)

    def behind(self, start: float, end: float) -> str:
        """The first and last kernels running within (start, end), "" when none."""
        first = int(np.searchsorted(self.reach, start, side="right"))
        last = int(np.searchsorted(self.start, end, side="left")) - 1
        if first > last:
            return ""
        if first == last:
            return self.names[first]
        return f"{self.names[first]} … {self.names[last]}"


def annotate(spans: list[Span]) -> list[Span]:
    """`spans` with every communication span's args extended by `hidden_s` and `behind`
    (against its own rank's compute spans); other spans unchanged, order kept."""
    kernels: dict[int, list[Span]] = {}
    for s in spans:
        if s.track == COMPUTE:
            kernels.setdefault(s.rank, []).append(s)
    busy = {rank: BusyTime(ks) for rank, ks in kernels.items()}
    comm = [i for i, s in enumerate(spans) if is_communication(s.track) and s.rank in busy]
    out = list(spans)
    for rank, members in _by_rank(spans, comm).items():
        start = np.array([spans[i].start_s for i in members], dtype=float)  # (m,)
        end = np.array([spans[i].end_s for i in members], dtype=float)  # (m,)
        hidden = busy[rank].up_to(end) - busy[rank].up_to(start)  # (m,)
        for i, h, s, e in zip(members, hidden.tolist(), start.tolist(), end.tolist()):
            args = {**spans[i].args, "hidden_s": h,
                    "behind": busy[rank].behind(s, e) if h > 0 else ""}
            out[i] = spans[i]._replace(args=args)
    return out


def _by_rank(spans: list[Span], indices: list[int]) -> dict[int, list[int]]:
    """{rank: the indices among `indices` of its spans}, in order."""
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(spans[i].rank, []).append(i)
    return groups
