"""Kernel launch cost on a stream and inside a CUDA graph (docs/launch.md).

A kernel issued on a stream pays the compute model's `launch_overhead_s`; captured in a CUDA
graph it pays the in-graph per-kernel cost instead, and every replay of a graph pays one graph
launch (cudaGraphLaunch). The only per-kernel measurement found is NVIDIA's (A. Gray, "Getting
Started with CUDA Graphs", NVIDIA Technical Blog, 2019; V100, CUDA 10.1): 20 back-to-back
2.9 us kernels take 3.8 us each on a stream and 3.4 us each replayed as one graph, launch
included, so a graph saves 0.4 us per kernel. No Hopper or Blackwell measurement was found.
"""

from dataclasses import dataclass

GRAPH_SAVING_S = 0.4e-6  # per kernel: 3.8 -> 3.4 us (NVIDIA blog above, V100)


@dataclass(frozen=True)
class LaunchCosts:
    """A GPU's launch costs in seconds: on a stream, per kernel in a graph, per graph replay."""

    kernel_s: float  # one kernel issued on a stream (ComputeCalibration.launch_overhead_s)
    graph_node_s: float  # one kernel replayed inside a CUDA graph
    graph_launch_s: float  # one cudaGraphLaunch of a captured region

    def graphed(self, seconds: float) -> float:
        """A kernel's time (its stream launch included) with the launch paid inside a graph."""
        return seconds - self.kernel_s + self.graph_node_s


def launch_costs(stated: dict, kernel_s: float) -> LaunchCosts:
    """The launch costs of a GPU whose profile states `stated` (us: graph_node_us,
    graph_launch_us; GPUProfile.launch) and whose stream launch is `kernel_s`: unstated, a
    graph kernel costs the stream launch less the blog's saving, and a graph launch costs one
    stream launch (one API call, as cudaLaunchKernel)."""
    node_us, graph_us = stated.get("graph_node_us"), stated.get("graph_launch_us")
    node_s = node_us * 1e-6 if node_us is not None else max(kernel_s - GRAPH_SAVING_S, 0.0)
    graph_s = graph_us * 1e-6 if graph_us is not None else kernel_s
    return LaunchCosts(kernel_s, node_s, graph_s)
