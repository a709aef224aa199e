"""One entry of a pipeline schedule: a forward, backward or weight-gradient step of one
micro-batch on one model chunk, and where a stage's chunks sit in the model (the placement)."""
from dataclasses import dataclass

FORWARD = "F"
BACKWARD = "B"  # the whole backward, or only its input gradients when the schedule has W steps
WEIGHT = "W"  # the weight gradients of a split backward (Qi et al., arXiv:2401.10241 §2)
ROUND_ROBIN = "round-robin"  # chunk c of stage r holds virtual stage c*p + r (Megatron)
V_SHAPE = "v"  # two chunks: stage r holds virtual stages r and 2p-1-r (ZB-V, DualPipeV)
DUAL = "dual"  # DualPipe: chunk 0 of rank r is stage r of the down pipeline (virtual stage r),
# chunk 1 stage p-1-r of the up pipeline (virtual stage p + (p-1-r) = 2p-1-r, as in the V);
# virtual stage k holds model stage k mod p, so every stage lives on two ranks


@dataclass(frozen=True, order=True)
class Step:
    """`kind` "F"/"B"/"W", 0-based `micro_batch`, `chunk` (model chunk on its stage, else 0)."""

    kind: str
    micro_batch: int
    chunk: int = 0

    def virtual_stage(self, stage: int, p: int, placement: str = ROUND_ROBIN) -> int:
        """The virtual stage this step's chunk holds on `stage`, under `placement`."""
        return virtual_stage_of(self.chunk, stage, p, placement)

    def __str__(self) -> str:
        suffix = f".{self.chunk}" if self.chunk else ""
        return f"{self.kind}{self.micro_batch}{suffix}"


Schedule = list[list[Step]]  # schedule[stage] = that stage's steps, in execution order


def virtual_stage_of(chunk: int, stage: int, p: int, placement: str = ROUND_ROBIN) -> int:
    """Round robin: c*p + r (Megatron); V: r for chunk 0, 2p-1-r for chunk 1
    (torch.distributed.pipelining ScheduleZBVZeroBubble's stage_id_chunk0/chunk1)."""
    if placement in (V_SHAPE, DUAL):
        return stage if chunk == 0 else 2 * p - 1 - stage
    return chunk * p + stage


def stage_of(virtual_stage: int, p: int, placement: str = ROUND_ROBIN) -> int:
    """The pipeline stage holding a virtual stage under `placement`."""
    if placement in (V_SHAPE, DUAL):
        return virtual_stage if virtual_stage < p else 2 * p - 1 - virtual_stage
    return virtual_stage % p


def route_ends(virtual_stage: int, p: int, v: int, placement: str = ROUND_ROBIN) -> tuple:
    """(first, last): whether a virtual stage starts (embedding) or ends (head and loss) its
    micro-batch's route; DualPipe's two pipelines are virtual stages 0..p-1 and p..2p-1."""
    if placement == DUAL:
        return virtual_stage % p == 0, virtual_stage % p == p - 1
    return virtual_stage == 0, virtual_stage == p * v - 1
