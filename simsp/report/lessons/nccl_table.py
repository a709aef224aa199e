"""The nccl-tests style table of `simsp ring` for ring collectives, and its --json object: what
ran where, one line per size (nccl-tests' size, count, time, algbw and busbw; GB/s = 1e9
bytes/s, NCCL PERFORMANCE.md) with the algorithm, protocol and channels NCCL runs, NVLS's
comparison where it can run, and a single size's per-channel breakdown of a ring. The times come
from engine/collectives/nccl_tests.py."""

from dataclasses import replace

from simsp.engine.collectives.nccl_tests import ELEM_BYTES, STEPWISE_MAX_RANKS, nvls_stats
from simsp.engine.collectives.nccl_tuning import choose
from simsp.engine.collectives.nvls import (NVLS, NVLS_EFFICIENCY, NVLS_LATENCY_S, nvls_available,
                                         nvls_in_group)
from simsp.engine.collectives.ring import CollectiveStats
from simsp.engine.collectives.ring_plan import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from simsp.engine.collectives.ring_timing import algbw_GBps, busbw_GBps
from simsp.hardware.constants import LinkCalibration
from simsp.hardware.cluster_hardware import nvswitch_generation
from simsp.hardware.profiles import gpu_profile
from simsp.report.lessons.ring import channel_words
from simsp.scenario.config import Cluster

ALONE_WORDS = "timed alone: closed form, or one node's piece step by step"
BUS_FACTOR_TEXT = {ALL_REDUCE: "2(n-1)/n", REDUCE_SCATTER: "(n-1)/n", ALL_GATHER: "(n-1)/n"}


def table_lines(collective: str, cluster: Cluster, gpus: list[int],
                rows: list[CollectiveStats], calibration: LinkCalibration) -> list[str]:
    """The whole table: header, one line per size, NVLS's pick where it can run, and a single
    size's per-channel breakdown."""
    lines = (header_lines(collective, cluster, gpus, calibration) + size_lines(rows)
             + nccl_pick_lines(cluster, rows, calibration))
    if len(rows) == 1 and rows[0].channels:
        lines += channel_lines(rows[0], cluster.gpus_per_node)
    return lines


def json_result(collective: str, stats: CollectiveStats) -> dict:
    """The --json object: exactly the documented keys."""
    n = len(stats.gpus)
    return {"collective": collective, "ranks": n, "size_bytes": stats.nbytes,
            "time_s": stats.time_s, "algbw_GBps": algbw_GBps(stats.nbytes, stats.time_s),
            "busbw_GBps": busbw_GBps(collective, n, stats.nbytes, stats.time_s),
            "bytes_sent_per_rank": list(stats.bytes_sent), "steps": stats.steps,
            "algorithm": stats.algorithm, "protocol": stats.protocol,
            "nchannels": stats.nchannels}


def header_lines(collective: str, cluster: Cluster, gpus: list[int],
            calibration: LinkCalibration | None = None) -> list[str]:
    """Comment lines: what ran where, the link speeds and calibration, the busbw factor."""
    ring = " -> ".join(f"gpu{g}" for g in gpus[:4]) + (" -> ..." if len(gpus) > 4 else "")
    calibration = calibration or LinkCalibration()
    forced = ", ".join(f"{env}={value}" for env, value in (("NCCL_ALGO", calibration.nccl_algo),
                       ("NCCL_PROTO", calibration.nccl_proto)) if value) or "none"
    return [
        f"# simsp ring: {collective}, {len(gpus)} ranks on {cluster.nodes} node(s) of "
        f"{cluster.gpus_per_node} GPUs, ring {ring} "
        f"({'stepwise simulation' if len(gpus) <= STEPWISE_MAX_RANKS else ALONE_WORDS})",
        f"# links: NVLink {cluster.nvlink_bandwidth_GBps:g} GB/s, IB "
        f"{cluster.ib_bandwidth_GBps:g} GB/s per direction; {LinkCalibration.from_cluster(cluster).describe()}",
        f"# busbw = algbw * {BUS_FACTOR_TEXT[collective]} (NCCL PERFORMANCE.md); "
        f"GB/s = 1e9 B/s; size = full message S",
        f"# algorithm, protocol and channels as NCCL 2.30 picks them (engine/collectives/nccl_tuning.py; "
        f"forced: {forced}); trees in closed form",
        "#",
        f"# {'size':>10} {'count':>13} {'type':>6} {'redop':>6} {'time':>12} {'algbw':>8} "
        f"{'busbw':>8} {'algo':>5} {'proto':>6} {'nch':>4}",
        f"# {'(B)':>10} {'(elements)':>13} {'':>6} {'':>6} {'(us)':>12} {'(GB/s)':>8} "
        f"{'(GB/s)':>8} {'':>5} {'':>6} {'':>4}",
    ]


def size_lines(rows: list[CollectiveStats]) -> list[str]:
    """One line per size, then nccl-tests' average bus bandwidth."""
    lines, busbws = [], []
    for stats in rows:
        n, collective = len(stats.gpus), stats.collective
        busbw = busbw_GBps(collective, n, stats.nbytes, stats.time_s)
        busbws.append(busbw)
        redop = "none" if collective == ALL_GATHER else "sum"
        lines.append(f"  {stats.nbytes:>10} {stats.nbytes // ELEM_BYTES:>13} {'float':>6} "
                     f"{redop:>6} {stats.time_s * 1e6:>12.2f} "
                     f"{algbw_GBps(stats.nbytes, stats.time_s):>8.2f} {busbw:>8.2f} "
                     f"{stats.algorithm:>5} {stats.protocol:>6} {stats.nchannels:>4}")
    lines.append(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.3f}")
    return lines


def nccl_pick_lines(cluster: Cluster, rows: list[CollectiveStats],
                    calibration: LinkCalibration) -> list[str]:
    """On an NVSwitch-3+ domain NCCL also weighs NVLS for an all-reduce and takes the lowest of
    its own estimates (tuning.cc, enqueue.cc): name NCCL's pick between the row above and NVLS
    per size, with both of simsp's times. Nothing where NVLS cannot run (training runs pick the
    same way: engine/collectives/nvls.py nvls_in_group)."""
    if not rows or rows[0].collective != ALL_REDUCE or nvls_available(
            nvswitch_generation(cluster), gpu_profile(cluster.gpu).nvlink_generation,
            cluster.nodes):
        return []
    able = replace(calibration, nvls_nvlink_generation=gpu_profile(cluster.gpu).nvlink_generation)
    lines = ["# NVLS (NVLink SHARP) can run here; NCCL's pick (lowest of its own estimates) "
             "between the row above and nvls per size (--nccl-algo nvls prints its table):"]
    for row in rows:
        nvls = nvls_stats(cluster, list(row.gpus), row.nbytes)
        estimate_us = choose(ALL_REDUCE, row.nbytes, len(row.gpus), 1,
                             cluster.nvlink_bandwidth_GBps, 0.0).estimated_time_s * 1e6
        picked = nvls_in_group(row.gpus, row.nbytes, cluster.gpus_per_node,
                               cluster.nvlink_bandwidth_GBps, able, estimate_us)
        lines.append(f"#   {row.nbytes:>10} B: {row.algorithm}/{row.protocol} "
                     f"{row.time_s * 1e6:.2f} us, nvls {nvls.time_s * 1e6:.2f} us -> "
                     f"{row.algorithm if picked is None else NVLS}")
    return lines


def nvls_table_lines(cluster: Cluster, gpus: list[int], rows: list[CollectiveStats],
                     others: list[CollectiveStats]) -> list[str]:
    """`--nccl-algo nvls`'s table: NVLS all-reduce `rows` at every size (closed form,
    engine/collectives/nvls.py), beside `others`, what NCCL's modelled choice among ring and tree
    (engine/collectives/nccl_tuning.py) does at the same sizes."""
    header = header_lines(ALL_REDUCE, cluster, gpus)
    header[0] = (header[0].replace("ring gpu", "NVLS (NVLink SHARP) over gpu")
                 .replace("stepwise simulation", "closed form")
                 .replace(ALONE_WORDS, "closed form"))
    header[2] += (f"; NVLS: S(1+1/n) per direction at link x nvlsEfficiency "
                  f"{NVLS_EFFICIENCY[gpu_profile(cluster.gpu).nvlink_generation]:g} "
                  f"+ {NVLS_LATENCY_S * 1e6:g} us (NVIDIA/nccl src/graph/tuning.cc)")
    choice = ["#", "# the same sizes as NCCL's ring/tree choice, and the faster (NCCL picks the "
              "algorithm of lowest predicted time, tuning.cc):"]
    choice += [f"#   {other.nbytes:>10} B: {other.algorithm}/{other.protocol} "
               f"{other.time_s * 1e6:.2f} us, busbw "
               f"{busbw_GBps(ALL_REDUCE, len(gpus), other.nbytes, other.time_s):.2f} GB/s -> "
               f"{NVLS if nvls.time_s < other.time_s else other.algorithm}"
               for nvls, other in zip(rows, others)]
    return header + size_lines(rows) + choice


# --------------------------------------------------------------------------------------------
# Per-channel breakdown
# --------------------------------------------------------------------------------------------


def channel_lines(stats: CollectiveStats, gpus_per_node: int) -> list[str]:
    """Per ring order (NCCL's channels share them: report/lessons/ring.py channel_words): its
    GPUs, the rail its node crossings use, bytes and time."""
    nics = _nics_per_node(stats, gpus_per_node)
    lines = [f"# {channel_words(stats.nchannels, len(stats.channels))}: across nodes one order "
             f"per GPU a node holds, rail by rail; NICs sending per node: {nics}",
             "# ring order: | = node crossing, ^N = relayed through gpuN's NIC over NVLink (PXN)",
             f"# {'order':>7} {'rail':>4} {'bytes':>12} {'sent/GPU':>12} {'time (us)':>10}"
             f"  ring order"]
    for ch in stats.channels:
        rail = "-" if ch.rail is None else str(ch.rail)
        lines.append(f"# {ch.index:>7} {rail:>4} {ch.nbytes:>12} {max(ch.bytes_sent):>12} "
                     f"{ch.time_s * 1e6:>10.2f}  {_ring_order(ch, gpus_per_node)}")
    return lines


def _ring_order(channel, gpus_per_node: int, shown: int = 24) -> str:
    """'0 1 2 ^0| 8 9 ...': the ring's GPUs with node crossings and PXN relays marked."""
    n, parts = len(channel.gpus), []
    for p, gpu in enumerate(channel.gpus[:shown]):
        nxt = channel.gpus[(p + 1) % n]
        relay = "" if channel.via[p] is None else f" ^{channel.via[p]}"
        cross = "|" if nxt // gpus_per_node != gpu // gpus_per_node else ""
        parts.append(f"{gpu}{relay}{cross}")
    return " ".join(parts) + (f" ... ({n} GPUs)" if n > shown else "")


def _nics_per_node(stats: CollectiveStats, gpus_per_node: int) -> str:
    """How many NICs each node sends through (min-max over nodes), and which rails."""
    rails: dict[int, set[int]] = {}
    for ch in stats.channels:
        n = len(ch.gpus)
        for p, gpu in enumerate(ch.gpus):
            if ch.gpus[(p + 1) % n] // gpus_per_node != gpu // gpus_per_node:
                nic = gpu if ch.via[p] is None else ch.via[p]
                rails.setdefault(gpu // gpus_per_node, set()).add(nic % gpus_per_node)
    if not rails:
        return "0 (one node: NVLink only)"
    counts = sorted({len(r) for r in rails.values()})
    used = sorted(set().union(*rails.values()))
    count = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{count} (rails {','.join(map(str, used))})"
