"""`simsp ring`: time ring collectives on the simulated cluster, in the style of nccl-tests.

    simsp ring --ranks N [--nodes K] [--collective C] (--size S | --min-size A --max-size B
               [--step-factor F]) [--explain] [--json]

Every size is simulated step by step (meta mode) over the cluster's links; the table shows
nccl-tests' size, count, time, algbw and busbw (GB/s = 1e9 bytes/s, NCCL PERFORMANCE.md).
"""

import math

import simpy

from simsp.cluster.topology import build_topology
from simsp.config import Cluster
from simsp.engine.collectives import RING_COLLECTIVES, CollectiveStats
from simsp.engine.network import Network
from simsp.engine.ring_plan import (ALL_GATHER, ALL_REDUCE, COLLECTIVES, REDUCE_SCATTER, STEPS,
                                    apply_step, bytes_sent_per_rank, chunk_counts, chunk_offsets,
                                    initial_holdings)
from simsp.engine.ring_timing import algbw_GBps, busbw_GBps
from simsp.errors import UserError
from simsp.hardware import LinkCalibration
from simsp.jsonout import dumps
from simsp.progress import track
from simsp.report.ring_lesson import MAX_LESSON_RANKS, write_ring_lesson
from simsp.units import parse_size

ELEM_BYTES = 4  # nccl-tests' default datatype: float (32-bit)
MAX_EXPLAIN_RANKS = 8
BUS_FACTOR_TEXT = {ALL_REDUCE: "2(n-1)/n", REDUCE_SCATTER: "(n-1)/n", ALL_GATHER: "(n-1)/n"}


def add_parser(subparsers) -> None:
    """Register `simsp ring` and its flags."""
    parser = subparsers.add_parser("ring", help="time ring collectives (nccl-tests style)",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, required=True, help="ranks in the ring")
    parser.add_argument("--nodes", type=int, default=None,
                        help="DGX nodes, ranks spread evenly (default: ceil(ranks/8))")
    parser.add_argument("--collective", choices=COLLECTIVES, default=ALL_REDUCE)
    parser.add_argument("--size", default=None, help="one message size: 8, 256K, 1M, 1G")
    parser.add_argument("--min-size", default=None, help="smallest size of a sweep")
    parser.add_argument("--max-size", default=None, help="largest size of a sweep")
    parser.add_argument("--step-factor", type=int, default=None,
                        help="multiply the size by this between sweep rows (default 2)")
    parser.add_argument("--explain", action="store_true", help="print every ring step")
    parser.add_argument("--json", action="store_true", help="one JSON object (single --size)")
    parser.add_argument("--html", metavar="FILE", default=None,
                        help="write the ring lesson as a teaching page (single --size)")
    parser.add_argument("--png", metavar="DIR", default=None,
                        help="write the ring lesson as slides, one PNG per step (single --size)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    """Check the flags, simulate every size, print the table, explanation or JSON."""
    sizes = _sizes(args)
    cluster, gpus = _placement(args.ranks, args.nodes)
    _check_modes(args, sizes)
    graph = build_topology(cluster)
    if args.html or args.png:
        write_ring_lesson(args.collective, graph, gpus, sizes[0], args.html, args.png)
    if args.json:
        print(dumps(_json_result(args.collective, simulate(graph, gpus, args.collective,
                                                               sizes[0]))))
        return 0
    if args.explain:
        print("\n".join(explain(args.collective, args.ranks, sizes[0])))
        print()
    quiet = getattr(args, "quiet", False) or len(sizes) < 2
    rows = [simulate(graph, gpus, args.collective, size)
            for size in track(sizes, "sizes", "size", quiet)]
    print("\n".join(_header(args.collective, cluster, gpus) + _table(rows)))
    return 0


# --------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------

def _sizes(args) -> list[int]:
    """The message sizes: one --size, or min, min*F, ... up to max (nccl-tests -b/-e/-f)."""
    sweep = args.min_size is not None or args.max_size is not None
    if args.size is not None and sweep:
        raise UserError("--size", "give either --size or --min-size/--max-size, not both")
    if args.size is None and not (args.min_size and args.max_size):
        raise UserError("--size", "give --size, or both --min-size and --max-size")
    if args.step_factor is not None and not sweep:
        raise UserError("--step-factor", "only applies to a --min-size/--max-size sweep")
    if args.size is not None:
        return [_element_size(parse_size(args.size, "--size"), "--size")]
    low = _element_size(parse_size(args.min_size, "--min-size"), "--min-size")
    high = parse_size(args.max_size, "--max-size")
    factor = 2 if args.step_factor is None else args.step_factor
    if low > high:
        raise UserError("--min-size", f"{low} is larger than --max-size {high}")
    if factor < 2:
        raise UserError("--step-factor", f"must be at least 2, got {factor}")
    sizes = [low]
    while sizes[-1] * factor <= high:
        sizes.append(sizes[-1] * factor)
    return sizes


def _element_size(nbytes: int, flag: str) -> int:
    """Sizes must be whole float32 elements."""
    if nbytes % ELEM_BYTES:
        raise UserError(flag, f"{nbytes} B is not a multiple of the {ELEM_BYTES}-byte float")
    return nbytes


def _placement(ranks: int, nodes: int | None) -> tuple[Cluster, list[int]]:
    """Cluster and GPUs of the ring: ranks spread evenly over the nodes, in order."""
    gpus_per_node = Cluster().gpus_per_node
    if ranks < 2:
        raise UserError("--ranks", f"a ring needs at least 2 ranks, got {ranks}")
    nodes = math.ceil(ranks / gpus_per_node) if nodes is None else nodes
    if nodes < 1:
        raise UserError("--nodes", f"must be positive, got {nodes}")
    if ranks % nodes:
        raise UserError("--ranks", f"{ranks} ranks do not spread evenly over {nodes} nodes "
                                   f"(pass a --nodes that divides --ranks)")
    per_node = ranks // nodes
    if per_node > gpus_per_node:
        raise UserError("--ranks", f"{ranks} ranks need {per_node} GPUs per node but a node "
                                   f"has {gpus_per_node}; add --nodes")
    gpus = [node * gpus_per_node + local for node in range(nodes) for local in range(per_node)]
    return Cluster(nodes=nodes), gpus


def _check_modes(args, sizes: list[int]) -> None:
    """--json and --explain describe one size; --explain prints one line per rank per step."""
    if args.json and args.explain:
        raise UserError("--json", "cannot be combined with --explain")
    for flag, wanted in (("--json", args.json), ("--explain", args.explain),
                         ("--html", args.html), ("--png", args.png)):
        if wanted and len(sizes) > 1:
            raise UserError(flag, "needs a single --size")
    limit = MAX_LESSON_RANKS if args.html or args.png else MAX_EXPLAIN_RANKS  # lesson: 16
    if args.explain and args.ranks > limit:
        raise UserError("--explain", f"prints every step of every rank: use at most "
                                     f"{limit} ranks, got {args.ranks}")


# --------------------------------------------------------------------------------------------
# Simulation and output
# --------------------------------------------------------------------------------------------

def simulate(graph, gpus: list[int], collective: str, nbytes: int,
             calibration: LinkCalibration | None = None) -> CollectiveStats:
    """Run one meta-mode ring collective of `nbytes` alone on the links; return its stats."""
    env = simpy.Environment()
    network = Network(env, graph, calibration)
    ring = RING_COLLECTIVES[collective](env, network, gpus, None, nbytes, ELEM_BYTES)
    process = env.process(ring)
    env.run()
    return process.value[1]


def _json_result(collective: str, stats: CollectiveStats) -> dict:
    """The --json object: exactly the documented keys."""
    n = len(stats.gpus)
    return {"collective": collective, "ranks": n, "size_bytes": stats.nbytes,
            "time_s": stats.time_s, "algbw_GBps": algbw_GBps(stats.nbytes, stats.time_s),
            "busbw_GBps": busbw_GBps(collective, n, stats.nbytes, stats.time_s),
            "bytes_sent_per_rank": list(stats.bytes_sent), "steps": stats.steps}


def _header(collective: str, cluster: Cluster, gpus: list[int]) -> list[str]:
    """Comment lines: what ran where, the link speeds and calibration, the busbw factor."""
    ring = " -> ".join(f"gpu{g}" for g in gpus[:4]) + (" -> ..." if len(gpus) > 4 else "")
    return [
        f"# simsp ring: {collective}, {len(gpus)} ranks on {cluster.nodes} node(s) of "
        f"{cluster.gpus_per_node} GPUs, ring {ring} (stepwise simulation)",
        f"# links: NVLink {cluster.nvlink_bandwidth_GBps:g} GB/s, IB "
        f"{cluster.ib_bandwidth_GBps:g} GB/s per direction; {LinkCalibration.from_cluster(cluster).describe()}",
        f"# busbw = algbw * {BUS_FACTOR_TEXT[collective]} (NCCL PERFORMANCE.md); "
        f"GB/s = 1e9 B/s; size = full message S",
        "#",
        f"# {'size':>10} {'count':>13} {'type':>6} {'redop':>6} {'time':>12} {'algbw':>8} "
        f"{'busbw':>8}",
        f"# {'(B)':>10} {'(elements)':>13} {'':>6} {'':>6} {'(us)':>12} {'(GB/s)':>8} "
        f"{'(GB/s)':>8}",
    ]


def _table(rows: list[CollectiveStats]) -> list[str]:
    """One line per size, then nccl-tests' average bus bandwidth."""
    lines, busbws = [], []
    for stats in rows:
        n, collective = len(stats.gpus), stats.collective
        busbw = busbw_GBps(collective, n, stats.nbytes, stats.time_s)
        busbws.append(busbw)
        redop = "none" if collective == ALL_GATHER else "sum"
        lines.append(f"  {stats.nbytes:>10} {stats.nbytes // ELEM_BYTES:>13} {'float':>6} "
                     f"{redop:>6} {stats.time_s * 1e6:>12.2f} "
                     f"{algbw_GBps(stats.nbytes, stats.time_s):>8.2f} {busbw:>8.2f}")
    lines.append(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.3f}")
    return lines


# --------------------------------------------------------------------------------------------
# --explain
# --------------------------------------------------------------------------------------------

def explain(collective: str, n: int, nbytes: int) -> list[str]:
    """Every step of the ring: what each rank sends, receives, reduces and then holds."""
    counts = chunk_counts(nbytes // ELEM_BYTES, n)
    chunk_bytes = [c * ELEM_BYTES for c in counts]
    steps = STEPS[collective](n)
    lines = _explain_intro(collective, n, nbytes, counts)
    holdings = initial_holdings(collective, n)
    lines += _holdings_lines("start", holdings, n)
    for overall, step in enumerate(steps):
        title = f"{step.phase} step {step.index + 1}/{n - 1}"
        if collective == ALL_REDUCE:
            title += f"  (all_reduce step {overall + 1}/{len(steps)})"
        holdings = apply_step(holdings, step)
        lines.append(title)
        lines += [_rank_line(step, rank, holdings, n) for rank in range(n)]
    return lines + _explain_summary(collective, n, nbytes, chunk_bytes)


def _explain_intro(collective: str, n: int, nbytes: int, counts: list[int]) -> list[str]:
    """The message, its chunks and the notation."""
    ring = " -> ".join(str(r) for r in range(n)) + " -> 0"
    chunks = ", ".join(f"c{c} = [{o}, {o + k})" for c, (o, k)
                       in enumerate(zip(chunk_offsets(counts), counts)))
    return [f"{collective} of {nbytes} B ({sum(counts)} float elements) over {n} ranks, "
            f"ring {ring}",
            f"chunks (elements): {chunks}",
            "notation: cK=a+b: the rank's copy of chunk K holds the sum of ranks a and b's data;"
            " all = summed over every rank; - = not held"]


def _rank_line(step, rank: int, holdings, n: int) -> str:
    """One rank at one step: send, receive, reduce or copy, and what it holds afterwards."""
    out, into = step.send_of(rank), step.receive_of(rank)
    action = "reduce" if step.reduce else "copy"
    return (f"  rank {rank}: send c{out.chunk} to {out.dst}, recv c{into.chunk} from "
            f"{into.src}, {action} c{into.chunk} | holds {_holds(holdings[rank], n)}")


def _holdings_lines(title: str, holdings, n: int) -> list[str]:
    """What every rank holds, one line per rank."""
    return [title] + [f"  rank {rank}: holds {_holds(holdings[rank], n)}" for rank in range(n)]


def _holds(row, n: int) -> str:
    """A rank's chunks in the cK=a+b notation."""
    def name(contributors) -> str:
        """'-', 'all', or the contributing ranks joined by '+'."""
        if not contributors:
            return "-"
        if len(contributors) == n and n > 1:
            return "all"
        return "+".join(str(r) for r in sorted(contributors))
    return " ".join(f"c{c}={name(who)}" for c, who in enumerate(row))


def _explain_summary(collective: str, n: int, nbytes: int, chunk_bytes: list[int]) -> list[str]:
    """Bytes each rank sent, and for all-reduce how it splits into its two phases."""
    sent = bytes_sent_per_rank(STEPS[collective](n), chunk_bytes)
    if collective != ALL_REDUCE:
        return [f"{n - 1} steps; bytes sent per rank {sent} ((n-1)/n*S = "
                f"{(n - 1) * nbytes / n:g})"]
    first = bytes_sent_per_rank(STEPS[REDUCE_SCATTER](n), chunk_bytes)
    second = bytes_sent_per_rank(STEPS[ALL_GATHER](n), chunk_bytes)
    return [f"all_reduce = reduce_scatter (steps 1-{n - 1}) then all_gather (steps {n}-"
            f"{2 * (n - 1)}): 2(n-1) = {2 * (n - 1)} steps",
            f"bytes sent per rank {sent} = reduce_scatter {first} + all_gather {second} "
            f"(2(n-1)/n*S = {2 * (n - 1) * nbytes / n:g})"]
