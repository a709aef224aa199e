"""The nccl-tests alltoall_perf table and --json object of `simsp ring --collective all_to_all`.

As nccl-tests: size = one rank's whole send buffer; busbw = algbw · (n − 1)/n (NCCL
PERFORMANCE.md). The times come from engine/collectives/all_to_all.py.
"""

from simsp.engine.collectives.all_to_all import ELEM_BYTES

ALL_TO_ALL = "all_to_all"


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
    """The --json object of one size: `size` bytes per rank's send buffer over `n` ranks."""
    algbw = size / seconds / 1e9 if seconds > 0 else 0.0
    return {"collective": ALL_TO_ALL, "ranks": n, "size_bytes": size, "time_s": seconds,
            "algbw_GBps": algbw, "busbw_GBps": algbw * (n - 1) / n,
            "bytes_sent_per_rank": [size * (n - 1) // n] * n}
