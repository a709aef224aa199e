"""All-to-all (and all-to-all-v) over the modelled links: every ordered pair's bytes at once.

NCCL has no ring for it: an all-to-all is one group of point-to-point sends and receives, rank i
sending its j-th chunk to rank j for every j (NVIDIA/nccl-tests src/alltoall.cu: ncclSend and
ncclRecv to every peer inside ncclGroupStart/End; NCCL src/enqueue.cc schedules the group's
peers together). So here every pair's transfer starts at the same instant on its own route:
NVLink through the node's NVSwitch inside a node, the GPU's NIC, leaf (and spine across rails)
between nodes, each sharing its links max-min fairly with everything else in flight
(engine/network.py). A rank's chunk to itself is a local copy and crosses no link. Megatron-LM's
alltoall token dispatcher (megatron/core/transformer/moe/token_dispatcher.py
MoEAlltoAllTokenDispatcher) sends each expert-parallel peer the tokens routed to its experts:
dispatch and combine are one all-to-all-v each.
"""

from dataclasses import dataclass

import simpy

from simsp.engine.network import Network

ELEM_BYTES = 4  # float, nccl-tests' default


@dataclass(frozen=True)
class AllToAllStats:
    """When an all-to-all started and ended, and each pair's delivery time."""

    start_s: float
    end_s: float
    arrivals_s: dict  # (src rank, dst rank) -> delivery time of its chunk

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s


def all_to_all(env: simpy.Environment, network: Network, gpus: list[int],
               send_bytes: list[list[int]], chunks: list[list] | None = None,
               label: str = "all_to_all"):
    """Rank i sends send_bytes[i][j] bytes (chunks[i][j] in numeric mode) to rank j, on GPUs
    `gpus`. Returns (received[j][i]: the chunk rank j got from rank i, or None, AllToAllStats)."""
    n = len(gpus)
    if len(send_bytes) != n or any(len(row) != n for row in send_bytes):
        raise ValueError(f"all_to_all needs an {n} x {n} byte matrix")
    start = env.now
    pending = {}
    for i in range(n):
        for j in range(n):
            if i != j:
                pending[(i, j)] = network.transfer(gpus[i], gpus[j], send_bytes[i][j],
                                                   f"{label} {i}->{j}")
    arrivals = {pair: start for pair in ((i, i) for i in range(n))}
    for pair, delivered in pending.items():
        yield delivered
        arrivals[pair] = delivered.value[1]
    received = [[None if chunks is None else _copy(chunks[i][j]) for i in range(n)]
                for j in range(n)]
    return received, AllToAllStats(start, env.now, arrivals)


def orbit_all_to_all(env: simpy.Environment, network: Network, orbits: tuple,
                     nbytes: dict[tuple[int, int], int]):
    """A meta all-to-all run as one flow per orbit of its pairs under a rail symmetry
    (shortcuts/rail_symmetry.py pair_orbits): `orbits` holds (src GPU, dst GPU, links of the
    pair's images), each flow draining the pair's bytes (`nbytes[(src, dst)]`, alike across an
    orbit) over its route and its images' links at one fair rate (Network.load), then the
    route's latency, as the pair's transfer would. Every image moves as its pair does (the
    full simulation is symmetric), so the last delivery ends the all-to-all. Returns
    AllToAllStats (arrivals of the orbits' pairs only)."""
    start = env.now
    pending = {}
    for src, dst, images in orbits:
        edges, latency_s = network.route_of(src, dst)
        pending[(src, dst)] = network.load(edges + images, nbytes[(src, dst)], latency_s)
    arrivals = {}
    for pair, delivered in pending.items():
        yield delivered
        arrivals[pair] = delivered.value[1]
    return AllToAllStats(start, env.now, arrivals)


def alone_time(graph, calibration, gpus: list[int],
               send_bytes: list[list[int]]) -> tuple[float, int]:
    """(seconds, flows started) of one all-to-all(-v) alone on its links: the same flows in a
    private simulation (what it takes in the run when no other traffic crosses its links), and
    the flows that simulation started (the work estimate's count, shortcuts/work_counts.py)."""
    env = simpy.Environment()
    network = Network(env, graph, calibration)
    process = env.process(all_to_all(env, network, gpus, send_bytes))
    env.run()
    return process.value[1].time_s, network.flows_started


def _copy(chunk):
    return None if chunk is None else chunk.copy()


def time_all_to_all(graph, gpus: list[int], size: int, calibration) -> tuple[int, float]:
    """(bytes per rank actually sent, seconds) of one all-to-all of `size` bytes per rank alone
    on the links: as nccl-tests (src/alltoall.cu), count = size / 4-byte floats rounded down to
    a multiple of the ranks, count / n to each peer."""
    n = len(gpus)
    per_peer = (size // ELEM_BYTES) // n * ELEM_BYTES
    env = simpy.Environment()
    network = Network(env, graph, calibration)
    matrix = [[per_peer] * n for _ in range(n)]
    process = env.process(all_to_all(env, network, gpus, matrix))
    env.run()
    return per_peer * n, process.value[1].time_s
