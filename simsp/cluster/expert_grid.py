"""The expert layers' rank grid: global rank <-> (etp, ep, edp, pp) in Megatron-LM's order.

Megatron-LM (megatron/core/parallel_state.py initialize_model_parallel, expert_decoder_rank_generator
with order "tp-cp-ep-dp-pp") lays the MoE layers' ranks out with expert tensor parallelism
fastest, then expert parallelism, then expert data parallelism, then the pipeline:
rank = etp + ETP·ep + ETP·EP·edp + ETP·EP·EDP·pp, EDP = world / (ETP·EP·PP). The pipeline
groups are those of the dense grid (simsp/cluster/grid.py); the expert weights are replicated
over, and their gradients reduced across, the EDP group only.
"""

from dataclasses import dataclass
import math
from typing import NamedTuple


class ExpertCoords(NamedTuple):
    """A rank's position on the expert layers' axes."""

    etp: int
    ep: int
    edp: int
    pp: int


@dataclass(frozen=True)
class ExpertGrid:
    """world = tp·dp·pp ranks seen by the expert layers (ETP defaults to TP); with context
    parallelism dp is d·cp: Megatron's expert generator has cp = 1 and tiles all t·cp·d ranks
    of a stage."""

    tp: int
    pp: int
    dp: int
    ep: int  # --expert-model-parallel-size
    etp: int | None = None  # --expert-tensor-parallel-size; None means tp

    def __post_init__(self):
        inner = self.etp_size * self.ep * self.pp
        if self.ep < 1 or self.etp_size < 1 or self.world_size % inner:
            raise ValueError(f"world size {self.world_size} is not divisible by "
                             f"ETP·EP·PP = {self.etp_size}·{self.ep}·{self.pp}")

    @property
    def etp_size(self) -> int:
        return self.etp or self.tp

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: world / (ETP·EP·PP)."""
        return self.world_size // (self.etp_size * self.ep * self.pp)

    def sizes(self) -> ExpertCoords:
        return ExpertCoords(self.etp_size, self.ep, self.edp, self.pp)

    def coords(self, rank: int) -> ExpertCoords:
        """(etp, ep, edp, pp) of `rank`: mixed-radix digits, etp fastest."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside [0, {self.world_size})")
        digits = []
        for size in self.sizes():
            rank, digit = divmod(rank, size)
            digits.append(digit)
        return ExpertCoords(*digits)

    def rank_of(self, c: ExpertCoords) -> int:
        rank, stride = 0, 1
        for digit, size in zip(c, self.sizes()):
            rank, stride = rank + digit * stride, stride * size
        return rank

    def group(self, axis: str, rank: int) -> tuple[int, ...]:
        """The ranks sharing every coordinate of `rank` but `axis` (etp, ep, edp or pp)."""
        c = self.coords(rank)
        size = getattr(self.sizes(), axis)
        return tuple(self.rank_of(c._replace(**{axis: i})) for i in range(size))

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every group along `axis`, ordered by their smallest rank: one per rank whose `axis`
        digit is 0, that rank and its steps of the axis' stride (the mixed radix of coords)."""
        sizes = self.sizes()
        place = ExpertCoords._fields.index(axis)
        stride, size = math.prod(sizes[:place]), sizes[place]
        return [tuple(range(base, base + stride * size, stride))
                for base in range(self.world_size) if base // stride % size == 0]
