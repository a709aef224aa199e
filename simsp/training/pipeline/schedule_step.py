"""One entry of a pipeline schedule: a forward or backward of one micro-batch on one model chunk."""
from dataclasses import dataclass

FORWARD = "F"
BACKWARD = "B"


@dataclass(frozen=True, order=True)
class Step:
    """`kind` "F"/"B", 0-based `micro_batch`, `chunk` (model chunk on its stage, else 0)."""

    kind: str
    micro_batch: int
    chunk: int = 0

    def virtual_stage(self, stage: int, p: int) -> int:
        """Megatron round-robin layout: chunk c of stage r holds virtual stage c*p + r."""
        return self.chunk * p + stage

    def __str__(self) -> str:
        suffix = f".{self.chunk}" if self.chunk else ""
        return f"{self.kind}{self.micro_batch}{suffix}"


Schedule = list[list[Step]]  # schedule[stage] = that stage's steps, in execution order
