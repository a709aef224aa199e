"""The time lower bound of DualPipe and DualPipeV where their F&B pairs overlap (TP or EP
collectives to hand the compute stream over at; docs/exploration.md gives the proof).

Inside a pair the run (training/pipeline/stage_program.py `_run_paired`) drives the backward's
B and W and the forward's F as two processes on the rank's PairedStreams
(model/blocks/moe/comm_stream.py): a compute stream that is a FIFO resource of one, held by a
process while it runs its kernels and handed over only while one of its collectives runs on
the communication stream. Every compute kernel of both halves (Rank.compute / Rank.hold; the
deferred weight-gradient GEMMs run beside a collective by the process still holding the
stream) thus runs inside the pair, one at a time, each at least its full-rate time (SM
contention only lowers the rate: engine/sm_share.py). So a pair lasts at least
F_c + B_c + W_c, the compute-kernel seconds of the chunk's F, B and W measured on the layer
simulated alone (layer_sim `compute_steps_s`), while its collectives may all hide. Steps
outside pairs run one at a time as in a run without the overlap and keep the layer's full
F, B, W. Each model op then takes no more than the run's, the pair waits both inputs
before it starts and sends after it ends in the run, so the list-schedule argument (every end a
max of sums of durations, none decreasing when a duration grows) bounds the iteration.

Not bounded (0): per-layer CUDA graphs, whose capture depth the two processes of a pair share
(model/cuda_graphs.py), so a kernel of one half may be charged the graphed launch while the
other half is inside a captured region: shorter than the layer alone measured it. A
whole-iteration graph charges every kernel its graphed time, alone as in the run: bounded.
"""

from functools import lru_cache

from simsp.training.pipeline.dualpipe import dualpipe, dualpipev
from simsp.training.pipeline.op_timing import Durations, simulate_ops

PER_LAYER_GRAPHS = ("local", "transformer_engine")  # scenario/cuda_graphs.py graph_impl values


@lru_cache(maxsize=1024)
def overlapped_pairs_time(name: str, p: int, m: int, steps: tuple, compute: tuple) -> float:
    """The iteration time of `name`'s own op lists (DualPipe's or DualPipeV's), each pair
    taking the sum of `compute` = (F_c, B_c, W_c) and every other op its `steps` = (F, B, W)
    seconds (a BW B + W), no communication; see the module docstring."""
    builder = {"dualpipe": dualpipe, "dualpipev": dualpipev}[name]
    return simulate_ops(builder(p, m), Durations(*steps, pair=sum(compute))).iteration_time
