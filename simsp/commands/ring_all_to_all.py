"""`simsp ring --collective all_to_all`: nccl-tests' alltoall_perf table on the simulated links.

As nccl-tests (src/alltoall.cu, AlltoAllGetCollByteCount): the size is one rank's whole send
buffer, count elements rounded down to a multiple of the ranks, each peer getting count / n;
busbw = algbw · (n − 1)/n (NCCL PERFORMANCE.md). Every pair's chunk moves at once over its
route (engine/all_to_all.py), a rank's own chunk is a local copy.
"""

import simpy

from simsp.engine.all_to_all import all_to_all
from simsp.engine.network import Network
from simsp.errors import UserError

ALL_TO_ALL = "all_to_all"
MAX_ALL_TO_ALL_RANKS = 64  # n(n − 1) flows at once: 4032 at 64 ranks
ELEM_BYTES = 4  # float, nccl-tests' default


def check_all_to_all(args) -> None:
    """The flags a ring collective has and an all-to-all does not."""
    if args.ranks > MAX_ALL_TO_ALL_RANKS:
        raise UserError("--ranks", f"an all-to-all runs n(n-1) transfers at once; at most "
                                   f"{MAX_ALL_TO_ALL_RANKS} ranks, got {args.ranks}")
    for flag, value in (("--explain", args.explain), ("--html", args.html), ("--png", args.png)):
        if value:
            raise UserError(flag, "describes a ring; all_to_all has none")
    for flag, value in (("--nccl-algo", args.nccl_algo), ("--nccl-proto", args.nccl_proto)):
        if value != "auto":
            raise UserError(flag, "all_to_all is point-to-point sends, no ring or tree algorithm")


def time_all_to_all(graph, gpus: list[int], size: int, calibration) -> tuple[int, float]:
    """(bytes per rank actually sent, seconds) of one all-to-all of `size` bytes per rank."""
    n = len(gpus)
    per_peer = (size // ELEM_BYTES) // n * ELEM_BYTES
    env = simpy.Environment()
    network = Network(env, graph, calibration)
    matrix = [[per_peer] * n for _ in range(n)]
    process = env.process(all_to_all(env, network, gpus, matrix))
    env.run()
    return per_peer * n, process.value[1].time_s


def table_lines(cluster, gpus: list[int], rows: list[tuple[int, float]], describe: str) -> list[str]:
    """Header comments, one line per size, the average bus bandwidth."""
    n = len(gpus)
    lines = [f"# simsp ring: all_to_all, {n} ranks on {cluster.nodes} node(s) of "
             f"{cluster.gpus_per_node} GPUs; every pair at once over NVLink inside a node, "
             f"the NICs across",
             f"# links: NVLink {cluster.nvlink_bandwidth_GBps:g} GB/s, IB "
             f"{cluster.ib_bandwidth_GBps:g} GB/s per direction; {describe}",
             "# busbw = algbw * (n-1)/n (NCCL PERFORMANCE.md); GB/s = 1e9 B/s; "
             "size = one rank's send buffer",
             "#",
             f"# {'size':>10} {'count':>13} {'type':>6} {'redop':>6} {'time':>12} "
             f"{'algbw':>8} {'busbw':>8}",
             f"# {'(B)':>10} {'(elements)':>13} {'':>6} {'':>6} {'(us)':>12} {'(GB/s)':>8} "
             f"{'(GB/s)':>8}"]
    busbws = []
    for size, seconds in rows:
        algbw = size / seconds / 1e9 if seconds > 0 else 0.0
        busbws.append(algbw * (n - 1) / n)
        lines.append(f"  {size:>10} {size // ELEM_BYTES:>13} {'float':>6} {'none':>6} "
                     f"{seconds * 1e6:>12.2f} {algbw:>8.2f} {busbws[-1]:>8.2f}")
    lines.append(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.3f}")
    return lines


def json_result(n: int, size: int, seconds: float) -> dict:
    algbw = size / seconds / 1e9 if seconds > 0 else 0.0
    return {"collective": ALL_TO_ALL, "ranks": n, "size_bytes": size, "time_s": seconds,
            "algbw_GBps": algbw, "busbw_GBps": algbw * (n - 1) / n,
            "bytes_sent_per_rank": [size * (n - 1) // n] * n}
