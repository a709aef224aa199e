"""The rank grid: global rank <-> (tp, cp, dp, pp) coordinates in Megatron-LM's order.

Megatron-LM (megatron/core/parallel_state.py, order "tp-cp-ep-dp-pp") numbers ranks with TP
varying fastest, then CP, then DP, then PP: rank = tp + t*cp + t*c*dp + t*c*d*pp (c = 1 without
context parallelism gives the three-axis grid). A TP group is therefore t consecutive ranks, inside one node
when t <= GPUs per node. Rank r runs on GPU r. Groups are tuples of ranks in ring order.
"""

from dataclasses import dataclass
from typing import NamedTuple


class Coords(NamedTuple):
    """A rank's position on the three parallel axes."""

    tp: int
    dp: int
    pp: int
    cp: int = 0


@dataclass(frozen=True)
class RankGrid:
    """t x d x p ranks laid out in Megatron-LM order (TP fastest, then DP, then PP)."""

    tp: int
    pp: int
    dp: int
    cp: int = 1  # context-parallel ranks (Megatron-LM --context-parallel-size)

    def __post_init__(self):
        """Every axis needs at least one rank."""
        for axis in ("tp", "pp", "dp", "cp"):
            if getattr(self, axis) < 1:
                raise ValueError(f"{axis} size must be positive, got {getattr(self, axis)}")

    @property
    def world_size(self) -> int:
        """Total ranks t*c*p*d."""
        return self.tp * self.cp * self.pp * self.dp

    def rank_of(self, tp: int, dp: int, pp: int, cp: int = 0) -> int:
        """Global rank at coordinates (tp, dp, pp, cp): tp + t*cp + t*c*dp + t*c*d*pp."""
        for name, value, size in (("tp", tp, self.tp), ("dp", dp, self.dp), ("pp", pp, self.pp),
                                  ("cp", cp, self.cp)):
            if not 0 <= value < size:
                raise ValueError(f"{name} coordinate {value} outside [0, {size})")
        tc = self.tp * self.cp
        return tp + self.tp * cp + tc * dp + tc * self.dp * pp

    def coords(self, rank: int) -> Coords:
        """Inverse of rank_of."""
        self._check_rank(rank)
        tc = self.tp * self.cp
        return Coords(tp=rank % self.tp, dp=(rank // tc) % self.dp,
                      pp=rank // (tc * self.dp), cp=(rank // self.tp) % self.cp)

    # Each group is an arithmetic progression of ranks (rank_of is linear in each coordinate),
    # built as a range: the CP and DP x CP groups of every rank cost O(cp) each, not O(cp) checks.

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks sharing `rank`'s dp and pp coordinates, in ring order (tp = 0, 1, ...)."""
        first = rank - self.coords(rank).tp
        return tuple(range(first, first + self.tp))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks sharing `rank`'s tp and pp coordinates, in ring order (dp = 0, 1, ...)."""
        c, tc = self.coords(rank), self.tp * self.cp
        first = self.rank_of(c.tp, 0, c.pp, c.cp)
        return tuple(range(first, first + tc * self.dp, tc))

    def pp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks sharing `rank`'s tp and dp coordinates, in stage order (pp = 0, 1, ...)."""
        c, stride = self.coords(rank), self.tp * self.cp * self.dp
        first = self.rank_of(c.tp, c.dp, 0, c.cp)
        return tuple(range(first, first + stride * self.pp, stride))

    def cp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks sharing `rank`'s tp, dp and pp coordinates, in ring order (cp = 0, 1, ...)."""
        c = self.coords(rank)
        first = self.rank_of(c.tp, c.dp, c.pp, 0)
        return tuple(range(first, first + self.tp * self.cp, self.tp))

    def dp_cp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks whose gradients are reduced together: same tp and pp, every (cp, dp), CP
        fastest (Megatron-LM's data-parallel group with context parallelism): rank_of(tp, d, pp,
        k) = first + t·(k + c·d), so the group is every t-th rank from the first."""
        c = self.coords(rank)
        first = self.rank_of(c.tp, 0, c.pp, 0)
        return tuple(range(first, first + self.tp * self.cp * self.dp, self.tp))

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every group along `axis` ("tp", "dp", "pp", "cp" or "dp_cp"), by their smallest rank."""
        group_of = {"tp": self.tp_group, "dp": self.dp_group, "pp": self.pp_group,
                    "cp": self.cp_group, "dp_cp": self.dp_cp_group}[axis]
        return [group_of(rank) for rank in self._firsts(axis)]

    def _firsts(self, axis: str) -> list[int]:
        """The smallest rank of every group along `axis`, ascending: the ranks whose
        coordinate on it is 0 (dp_cp: both), as rank_of places them."""
        fixed = {"tp": ("tp",), "dp": ("dp",), "pp": ("pp",), "cp": ("cp",),
                 "dp_cp": ("dp", "cp")}[axis]
        free = [range(1) if name in fixed else range(getattr(self, name))
                for name in ("tp", "dp", "pp", "cp")]
        return sorted(self.rank_of(tp, dp, pp, cp) for tp in free[0] for dp in free[1]
                      for pp in free[2] for cp in free[3])

    def _check_rank(self, rank: int) -> None:
        """Reject ranks outside the world."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside [0, {self.world_size})")
