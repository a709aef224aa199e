"""The rank grid: global rank <-> (tp, dp, pp) coordinates in Megatron-LM's order.

Megatron-LM (megatron/core/parallel_state.py) numbers ranks with TP varying fastest, then DP,
then PP: rank = tp + t*dp + t*d*pp. A TP group is therefore t consecutive ranks, inside one node
when t <= GPUs per node. Rank r runs on GPU r. Groups are tuples of ranks in ring order.
"""

from dataclasses import dataclass
from typing import NamedTuple


class Coords(NamedTuple):
    """A rank's position on the three parallel axes."""

    tp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class RankGrid:
    """t x d x p ranks laid out in Megatron-LM order (TP fastest, then DP, then PP)."""

    tp: int
    pp: int
    dp: int

    def __post_init__(self):
        """Every axis needs at least one rank."""
        for axis in ("tp", "pp", "dp"):
            if getattr(self, axis) < 1:
                raise ValueError(f"{axis} size must be positive, got {getattr(self, axis)}")

    @property
    def world_size(self) -> int:
        """Total ranks t*p*d."""
        return self.tp * self.pp * self.dp

    def rank_of(self, tp: int, dp: int, pp: int) -> int:
        """Global rank at coordinates (tp, dp, pp): tp + t*dp + t*d*pp."""
        for name, value, size in (("tp", tp, self.tp), ("dp", dp, self.dp), ("pp", pp, self.pp)):
            if not 0 <= value < size:
                raise ValueError(f"{name} coordinate {value} outside [0, {size})")
        return tp + self.tp * dp + self.tp * self.dp * pp

    def coords(self, rank: int) -> Coords:
        """Inverse of rank_of."""
        self._check_rank(rank)
        return Coords(tp=rank % self.tp, dp=(rank // self.tp) % self.dp,
                      pp=rank // (self.tp * self.dp))

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks sharing `rank`'s dp and pp coordinates, in ring order (tp = 0, 1, ...)."""
        c = self.coords(rank)
        return tuple(self.rank_of(i, c.dp, c.pp) for i in range(self.tp))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks sharing `rank`'s tp and pp coordinates, in ring order (dp = 0, 1, ...)."""
        c = self.coords(rank)
        return tuple(self.rank_of(c.tp, i, c.pp) for i in range(self.dp))

    def pp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks sharing `rank`'s tp and dp coordinates, in stage order (pp = 0, 1, ...)."""
        c = self.coords(rank)
        return tuple(self.rank_of(c.tp, c.dp, i) for i in range(self.pp))

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every group along `axis` ("tp", "dp" or "pp"), ordered by their smallest rank."""
        group_of = {"tp": self.tp_group, "dp": self.dp_group, "pp": self.pp_group}[axis]
        return sorted({group_of(rank) for rank in range(self.world_size)})

    def _check_rank(self, rank: int) -> None:
        """Reject ranks outside the world."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside [0, {self.world_size})")
