"""Pipeline schedules with a split backward, as data: per rank an ordered list of ops, each one
task (F, B, W or a full backward BW) or an overlapped F&B pair, and each micro-batch's route.

Kinds follow Qi et al., "Zero Bubble Pipeline Parallelism" (arXiv:2401.10241) §2: F the forward
of one chunk, B its input-gradient backward, W its weight-gradient backward. BW is B and W run as
one (a plain backward: DualPipe's `_backward_chunk(enable_zb=False)`, the table's "B" of the
DeepSeek-V3 report, arXiv:2412.19437 Table 2). An F&B pair is two tasks of two micro-batches run
together on one rank (DualPipe's `_forward_backward_chunk`, deepseek-ai/DualPipe
dualpipe/dualpipe.py).
"""
from dataclasses import dataclass

FORWARD = "F"
INPUT_GRAD = "B"
WEIGHT_GRAD = "W"
FULL_BACKWARD = "BW"
KINDS = (FORWARD, INPUT_GRAD, WEIGHT_GRAD, FULL_BACKWARD)
GRADIENT_KINDS = (INPUT_GRAD, FULL_BACKWARD)  # the tasks that send an input gradient upstream


@dataclass(frozen=True, order=True)
class Task:
    """One piece of work: `kind` (F, B, W, BW), global `micro_batch`, `chunk` on its rank."""

    kind: str
    micro_batch: int
    chunk: int = 0

    def __str__(self) -> str:
        """'F3.0': kind, micro-batch, chunk."""
        return f"{self.kind}{self.micro_batch}.{self.chunk}"


@dataclass(frozen=True)
class Op:
    """What a rank runs at once: one task, or two tasks overlapped as an F&B pair."""

    tasks: tuple[Task, ...]

    @property
    def is_pair(self) -> bool:
        """True for an overlapped forward-and-backward pair."""
        return len(self.tasks) == 2

    def __str__(self) -> str:
        """'F3.0&BW5.1' for a pair, else the task."""
        return "&".join(map(str, self.tasks))


Stage = tuple[int, int]  # (rank, chunk) holding one stage of the model


@dataclass(frozen=True)
class OpSchedule:
    """`ops[rank]` that rank's ops in order; `routes[micro_batch]` the (rank, chunk) stages the
    micro-batch's forward passes through, first stage first (its backward runs them reversed)."""

    name: str
    ops: tuple[tuple[Op, ...], ...]
    routes: tuple[tuple[Stage, ...], ...]

    @property
    def ranks(self) -> int:
        """Pipeline ranks (devices)."""
        return len(self.ops)

    @property
    def micro_batches(self) -> int:
        """Micro-batches of one iteration."""
        return len(self.routes)

    def position(self, task: Task, rank: int) -> int:
        """Index of the task's (rank, chunk) stage on its micro-batch's route."""
        return self.routes[task.micro_batch].index((rank, task.chunk))


def single(kind: str, micro_batch: int, chunk: int = 0) -> Op:
    """An op of one task."""
    return Op((Task(kind, micro_batch, chunk),))


def line_routes(ranks: int, micro_batches: int) -> tuple[tuple[Stage, ...], ...]:
    """Every micro-batch through chunk 0 of ranks 0..p-1 (GPipe, 1F1B and ZB-H1's placement)."""
    route = tuple((rank, 0) for rank in range(ranks))
    return tuple(route for _ in range(micro_batches))
