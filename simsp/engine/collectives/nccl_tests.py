"""One collective timed alone on the cluster's links, as nccl-tests measures it (`simsp ring`):
float elements, the algorithm, protocol and channels NCCL picks (nccl_tuning.py), the ring
simulated step by step in meta mode, or timed alone above STEPWISE_MAX_RANKS ranks as
ring_alone.py does; trees (ring_timing.tree_time) and NVLS (nvls.py) in closed form."""

from dataclasses import replace

import simpy

from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.nccl_tuning import RING, TREE
from simsp.engine.collectives.nvls import NVLS, nvls_all_reduce_time, nvls_bytes_per_direction
from simsp.engine.collectives.ring import RING_COLLECTIVES, CollectiveStats
from simsp.engine.collectives.ring_alone import alone_stats
from simsp.engine.collectives.ring_plan import ALL_REDUCE
from simsp.engine.collectives.ring_timing import tree_time
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration
from simsp.hardware.profiles import gpu_profile

ELEM_BYTES = 4  # nccl-tests' default datatype: float (32-bit)
STEPWISE_MAX_RANKS = 32  # larger rings: ring_alone (the stepwise ring costs ~n^2 flow events)


def simulate_nccl(graph, gpus: list[int], collective: str, nbytes: int,
                  calibration: LinkCalibration | None = None) -> CollectiveStats:
    """One collective as NCCL picks it: a tree all-reduce in closed form, else the ring
    (simulate); its stats carry the algorithm, protocol and channels."""
    choice = nccl_choice(collective, graph, gpus, nbytes, calibration)
    if choice.algorithm == TREE:  # steps: up and down the tree's depth; bytes not itemised
        seconds = tree_time(graph, gpus, nbytes, calibration, choice)
        nodes = len({gpu // graph.graph["gpus_per_node"] for gpu in gpus})
        steps = 2 * (len(gpus) // nodes - 1 + nodes.bit_length() - 1)
        return CollectiveStats(collective, tuple(gpus), nbytes, steps, (), (), 0.0, seconds, (),
                               TREE, choice.protocol, choice.nchannels)
    stats = simulate(graph, gpus, collective, nbytes, calibration)
    return replace(stats, algorithm=RING, protocol=choice.protocol, nchannels=choice.nchannels)


def simulate(graph, gpus: list[int], collective: str, nbytes: int,
             calibration: LinkCalibration | None = None) -> CollectiveStats:
    """Run one meta-mode ring collective of `nbytes` alone on the links; return its stats
    (above STEPWISE_MAX_RANKS ranks timed as engine/collectives/ring_alone.py does: the closed form where
    it is exact, one node's piece of one channel step by step where the ring is symmetric,
    else the closed form)."""
    if len(gpus) > STEPWISE_MAX_RANKS:
        return alone_stats(collective, graph, gpus, nbytes, calibration, ELEM_BYTES,
                           STEPWISE_MAX_RANKS)
    env = simpy.Environment()
    network = Network(env, graph, calibration)
    ring = RING_COLLECTIVES[collective](env, network, gpus, None, nbytes, ELEM_BYTES)
    process = env.process(ring)
    env.run()
    return process.value[1]


def nvls_stats(cluster, gpus: list[int], nbytes: int) -> CollectiveStats:
    """An NVLS all-reduce's stats on `cluster` (scenario.config.Cluster): one switch reduction,
    S(1 + 1/n) sent by every GPU."""
    n, gpu = len(gpus), gpu_profile(cluster.gpu)
    seconds = nvls_all_reduce_time(nbytes, n, cluster.nvlink_bandwidth_GBps,
                                   cluster.nvlink_efficiency, gpu.nvlink_generation)
    sent = (round(nvls_bytes_per_direction(nbytes, n)),) * n
    return CollectiveStats(ALL_REDUCE, tuple(gpus), nbytes, 1, sent, sent, 0.0, seconds, (),
                           NVLS, "Simple", 0)
