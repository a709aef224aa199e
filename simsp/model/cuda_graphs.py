"""CUDA graphs on one rank: which regions of a layer are captured, and what their kernels pay
for launch (docs/launch.md). A kernel inside a captured region pays the in-graph per-kernel cost
instead of its stream launch (simsp/hardware/launch.py), and the first kernel of each replay
also pays one graph launch. Regions as Megatron-LM captures them
(megatron/core/transformer/transformer_layer.py): "layer" the whole TransformerLayer, "attn"
_forward_attention (the input norm, attention, its dropout-add), "mlp"/"moe" _forward_mlp of a
dense/MoE layer; the backward of each region is captured with it. full_iteration captures every
kernel of the forward-backward; its one graph launch per iteration is not charged.
"""

from contextlib import contextmanager
from dataclasses import dataclass

from simsp.hardware.launch import LaunchCosts


@dataclass
class CudaGraphs:
    """A rank's captured regions, its launch costs, and where its program is now."""

    regions: frozenset  # region names captured: layer, attn, mlp, moe
    costs: LaunchCosts
    depth: int = 0  # captured regions the program is inside now (full_iteration: always 1)
    pending_s: float = 0.0  # a graph launch not yet charged to a kernel

    def kernel(self, seconds: float) -> float:
        """A kernel's time as launched now: from a graph inside a captured region."""
        if not self.depth:
            return seconds
        charged, self.pending_s = self.costs.graphed(seconds) + self.pending_s, 0.0
        return charged


def cuda_graphs(impl: str, modules: tuple, costs: LaunchCosts) -> CudaGraphs | None:
    """A rank's CudaGraphs for Megatron's resolved --cuda-graph-impl and modules; None: none."""
    if impl == "none":
        return None
    if impl == "full_iteration":
        return CudaGraphs(frozenset(), costs, depth=1)
    return CudaGraphs(frozenset(modules or ("layer",)), costs)


@contextmanager
def captured(r, region: str):
    """Run the `with` body as one replay of a captured `region` where it is captured (a region
    inside a captured one is part of that replay)."""
    graphs = r.graphs
    if graphs is None or region not in graphs.regions:
        yield
        return
    if graphs.depth == 0:
        graphs.pending_s = graphs.costs.graph_launch_s
    graphs.depth += 1
    try:
        yield
    finally:
        graphs.depth -= 1
        if graphs.depth == 0:
            graphs.pending_s = 0.0
