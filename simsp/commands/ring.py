"""`simsp ring`: time ring collectives on the simulated cluster, in the style of nccl-tests.

    simsp ring --ranks N [--nodes K] [--collective C] (--size S | --min-size A --max-size B
               [--step-factor F]) [--nccl-algo {auto,ring,tree}]
               [--nccl-proto {auto,LL,LL128,Simple}] [--explain] [--json]

Every size runs as NCCL would pick it (engine/collectives/nccl_tuning.py: algorithm, protocol,
channels; NCCL_ALGO / NCCL_PROTO force them), timed alone on the cluster's links by
engine/collectives/nccl_tests.py: rings step by step (meta mode) as NCCL's channels (one ring per
GPU a node holds, laid out rail by rail across nodes); rings of more than 32 ranks as
engine/collectives/ring_alone.py times them (in closed form where no link carries two of their
hops, else one node's piece of one channel step by step where the ring is symmetric, else in
closed form, an upper bound: docs/shortcuts.md); tree all-reduces in closed form
(ring_timing.tree_time). The table (report/lessons/nccl_table.py) shows nccl-tests' size, count,
time, algbw and busbw (GB/s = 1e9 bytes/s, NCCL PERFORMANCE.md) and the algorithm, protocol and
channels NCCL runs; a single size adds the per-channel breakdown of a ring. The lessons
(--explain, --html, --png) and the all_to_all and ring_attention collectives are written by
report/lessons/ (the sizes and the ranks' placement read from the flags by ring_flags.py,
ring attention's layer by attention_flags.py). This module only reads the flags and dispatches.
"""

from pathlib import Path

from collections import Counter

from simsp.cluster.topology import build_topology, route_tier
from simsp.engine.collectives.all_to_all import time_all_to_all
from simsp.engine.collectives.nccl_tests import ELEM_BYTES, nvls_stats, simulate_nccl
from simsp.engine.collectives.nccl_tuning import PROTOCOLS, RING, TREE
from simsp.engine.collectives.nvls import NVLS, nvls_available
from simsp.engine.collectives.ring_plan import ALL_REDUCE, COLLECTIVES, channel_rings
from simsp.errors import UserError
from simsp.hardware.constants import LinkCalibration
from simsp.hardware.cluster_hardware import nvswitch_generation
from simsp.hardware.profiles import gpu_profile
from simsp.io_out import check_folder, check_out_file
from simsp.jsonout import dumps
from simsp.outdir import prepare_out_dir
from simsp.progress import track
from simsp.report.lessons import RING_ATTENTION, all_to_all_table, nccl_table
from simsp.report.lessons.attention_flags import (add_attention_flags, attention_shape,
                                                  refuse_attention_flags)
from simsp.report.lessons.ring import MAX_LESSON_RANKS, lesson_data
from simsp.report.lessons.ring_flags import message_sizes, ring_placement, system_cluster
from simsp.report.lessons.ring_page import write_page
from simsp.report.lessons.ring_slides import write_slides
from simsp.report.lessons.ring_text import lesson_text
from simsp.scenario.config import Cluster
from simsp.scenario.flags import nonempty

AUTO = "auto"
ALL_TO_ALL = all_to_all_table.ALL_TO_ALL
MAX_EXPLAIN_RANKS = 8
MAX_ALL_TO_ALL_RANKS = 64  # n(n - 1) transfers at once: 4032 at 64 ranks


def add_parser(subparsers) -> None:
    """Register `simsp ring` and its flags."""
    parser = subparsers.add_parser("ring", help="time ring collectives (nccl-tests style)",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, required=True, help="ranks in the ring")
    parser.add_argument("--nodes", type=int, default=None,
                        help="DGX nodes, ranks spread evenly (default: ceil(ranks/8))")
    parser.add_argument("--collective", choices=COLLECTIVES + (ALL_TO_ALL, RING_ATTENTION),
                        default=ALL_REDUCE)
    parser.add_argument("--size", default=None,
                        help="one message size in bytes: 8, 256K, 1.5M, 1G; K, M and G are "
                             "powers of 1024 as nccl-tests reads -b/-e: 1G = 1GB = 2^30 bytes "
                             "(src/common.cu parsesize)")
    parser.add_argument("--min-size", default=None, help="smallest size of a sweep (as --size)")
    parser.add_argument("--max-size", default=None, help="largest size of a sweep (as --size)")
    parser.add_argument("--step-factor", type=int, default=None,
                        help="multiply the size by this between sweep rows (default 2)")
    parser.add_argument("--nccl-algo", choices=(AUTO, RING, TREE, NVLS), default=AUTO,
                        help="NCCL algorithm, as NCCL_ALGO: auto (NCCL's choice per size, "
                             "default), ring, tree (all-reduce only), or nvls (NVLink SHARP "
                             "all-reduce in one NVSwitch-3+ domain, simsp/engine/collectives/nvls.py)")
    parser.add_argument("--system", type=nonempty, default=None,
                        help="system profile whose nodes hold the ranks (dgx-a100, dgx-h100, "
                             "dgx-h200, dgx-b200, gb200-nvl72 or a .toml; default: DGX A100)")
    parser.add_argument("--nccl-proto", choices=(AUTO,) + PROTOCOLS, default=AUTO,
                        help="NCCL protocol, as NCCL_PROTO: auto (NCCL's choice per size, "
                             "default), LL, LL128 or Simple")
    parser.add_argument("--explain", action="store_true", help="print every ring step")
    parser.add_argument("--json", action="store_true", help="one JSON object (single --size)")
    parser.add_argument("--html", metavar="FILE", default=None,
                        help="write the ring lesson as a teaching page (single --size)")
    parser.add_argument("--png", metavar="DIR", default=None,
                        help="write the ring lesson as slides, one PNG per step (single --size)")
    add_attention_flags(parser)
    parser.set_defaults(handler=run)


def run(args) -> int:
    """Check the flags, simulate every size, print the table, explanation or JSON."""
    if args.collective == RING_ATTENTION:
        return _run_ring_attention(args)
    refuse_attention_flags(args)
    sizes = message_sizes(args)
    cluster, gpus = ring_placement(args.ranks, args.nodes, system_cluster(args.system))
    if args.collective == ALL_TO_ALL:
        return _run_all_to_all(args, sizes, cluster, gpus)
    _check_modes(args, sizes)
    _check_algo(args, cluster, gpus)
    if args.nccl_algo == NVLS:
        return _run_nvls(args, cluster, gpus, sizes)
    graph = build_topology(cluster)
    calibration = _forced(args)
    if args.html or args.png:
        _write_lesson(args, graph, gpus, sizes[0])
    if args.json:
        print(dumps(nccl_table.json_result(args.collective, simulate_nccl(
            graph, gpus, args.collective, sizes[0], calibration))))
        return 0
    if args.explain:
        print("\n".join(lesson_text(lesson_data(args.collective, graph, gpus, sizes[0],
                                                ELEM_BYTES))))
        print()
    quiet = getattr(args, "quiet", False) or len(sizes) < 2
    rows = [simulate_nccl(graph, gpus, args.collective, size, calibration)
            for size in track(sizes, "sizes", "size", quiet)]
    print("\n".join(nccl_table.table_lines(args.collective, cluster, gpus, rows, calibration)
                    + _route_tier_lines(graph, gpus)))
    return 0


def _route_tier_lines(graph, gpus: list[int]) -> list[str]:
    """Across nodes: channel 0's hops per latency class (cluster/topology.py route_tier) and
    the fabric's oversubscription."""
    if graph.graph["nodes"] == 1 or len({gpu // graph.graph["gpus_per_node"]
                                         for gpu in gpus}) == 1:
        return []
    channel = channel_rings(gpus, graph.graph["gpus_per_node"])[0]
    order = channel.order
    tiers = Counter(route_tier(graph, gpus[order[i]], gpus[order[(i + 1) % len(order)]],
                               channel.via[i]) for i in range(len(order)))
    counts = ", ".join(f"{tiers[tier]} {tier}" for tier in ("nvlink", "leaf", "spine", "core")
                       if tiers[tier])
    fabric = graph.graph["fabric"]
    return [f"# channel 0's hops by route class: {counts}; fabric {fabric.nodes_per_leaf} "
            f"nodes per leaf, {fabric.oversubscription:g}:1"]


def _check_all_to_all(args) -> None:
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


def _run_all_to_all(args, sizes: list[int], cluster: Cluster, gpus: list[int]) -> int:
    """nccl-tests' alltoall_perf table (report/lessons/all_to_all_table.py)."""
    _check_all_to_all(args)
    if args.json and len(sizes) > 1:
        raise UserError("--json", "needs a single --size")
    graph, calibration = build_topology(cluster), LinkCalibration.from_cluster(cluster)
    quiet = getattr(args, "quiet", False) or len(sizes) < 2
    rows = [time_all_to_all(graph, gpus, size, calibration)
            for size in track(sizes, "sizes", "size", quiet)]
    if args.json:
        print(dumps(all_to_all_table.json_result(len(gpus), *rows[0])))
    else:
        print("\n".join(all_to_all_table.table_lines(cluster, gpus, rows,
                                                     calibration.describe())))
    return 0


def _write_lesson(args, graph, gpus: list[int], nbytes: int) -> None:
    """--html FILE / --png DIR: the ring lesson (report/lessons/ring.py) as a page and/or
    slides."""
    if len(gpus) > MAX_LESSON_RANKS:
        raise UserError("--html" if args.html else "--png", f"the lesson draws every rank and "
                        f"chunk: use at most {MAX_LESSON_RANKS} ranks, got {len(gpus)}")
    data = lesson_data(args.collective, graph, gpus, nbytes)
    if args.html:
        write_page(data, args.html)
    if args.png:
        write_slides(data, args.png)


# --------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------

def _check_modes(args, sizes: list[int]) -> None:
    """--json and --explain describe one size; --explain prints one line per rank per step."""
    if args.json and args.explain:
        raise UserError("--json", "cannot be combined with --explain")
    for flag, wanted in (("--json", args.json), ("--explain", args.explain),
                         ("--html", args.html), ("--png", args.png)):
        if wanted and len(sizes) > 1:
            raise UserError(flag, "needs a single --size")
    if args.html:
        check_out_file(args.html, "--html")
    if args.png:
        _check_png_folder(args.png)
    limit = MAX_LESSON_RANKS if args.html or args.png else MAX_EXPLAIN_RANKS  # lesson: 16
    if args.explain and args.ranks > limit:
        raise UserError("--explain", f"prints every step of every rank: use at most "
                                     f"{limit} ranks, got {args.ranks}")


def _check_png_folder(folder: str) -> None:
    """--png DIR: created and probed before any work; a link or file in the way is an error."""
    try:
        check_folder(folder)
    except UserError as exc:
        raise UserError("--png", f"{folder}: {exc.reason}") from None
    prepare_out_dir(Path(folder), "--png")


def _check_algo(args, cluster: Cluster, gpus: list[int]) -> None:
    """NCCL runs reduce-scatter and all-gather as rings only (tuning.cc); --explain shows ring
    steps; NVLS is an all-reduce inside one NVSwitch-3+ domain."""
    if args.nccl_algo == NVLS:
        _check_nvls(args, cluster)
        return
    if args.nccl_algo != TREE:
        return
    if args.collective != ALL_REDUCE:
        raise UserError("--nccl-algo", f"tree runs all_reduce only, not {args.collective}")
    if args.explain or args.html or args.png:
        raise UserError("--nccl-algo", "--explain, --html and --png show ring steps: not with "
                                       "tree")


def _check_nvls(args, cluster: Cluster) -> None:
    """--nccl-algo nvls: an all-reduce at Simple in one NVSwitch-3+ domain, no ring steps."""
    if args.collective != ALL_REDUCE:
        raise UserError("--nccl-algo", f"nvls runs all_reduce only here, not {args.collective}")
    if args.nccl_proto not in (AUTO, "Simple"):
        raise UserError("--nccl-proto", "NVLS runs the Simple protocol only (tuning.cc)")
    for flag, given in (("--explain", args.explain), ("--html", args.html), ("--png", args.png)):
        if given:
            raise UserError(flag, "shows ring steps; nvls has none (one switch reduction)")
    why = nvls_available(nvswitch_generation(cluster), gpu_profile(cluster.gpu).nvlink_generation,
                         cluster.nodes)
    if why:
        raise UserError("--nccl-algo", why)



def _run_nvls(args, cluster: Cluster, gpus: list[int], sizes: list[int]) -> int:
    """NVLS all-reduce at every size, beside NCCL's modelled choice among ring and tree at the
    same sizes (report/lessons/nccl_table.py nvls_table_lines)."""
    rows = [nvls_stats(cluster, gpus, size) for size in sizes]
    if args.json:
        print(dumps(nccl_table.json_result(ALL_REDUCE, rows[0])))
        return 0
    graph = build_topology(cluster)
    others = [simulate_nccl(graph, gpus, ALL_REDUCE, size, LinkCalibration.from_cluster(cluster))
              for size in sizes]
    print("\n".join(nccl_table.nvls_table_lines(cluster, gpus, rows, others)))
    return 0


# --------------------------------------------------------------------------------------------
# Ring attention: context parallelism's ring carrying K and V (report/lessons/ring_attention.py)
# --------------------------------------------------------------------------------------------

def _check_ring_attention(args) -> None:
    """The flags of a ring collective that ring attention has no use for."""
    for flag, given in (("--size", args.size), ("--min-size", args.min_size),
                        ("--max-size", args.max_size), ("--step-factor", args.step_factor)):
        if given is not None:
            raise UserError(flag, "ring_attention's K/V block comes from --seq-length, the heads "
                                  "and --kv-channels, not a message size")
    for flag, value in (("--nccl-algo", args.nccl_algo), ("--nccl-proto", args.nccl_proto)):
        if value != AUTO:
            raise UserError(flag, "ring_attention is point-to-point sends, no NCCL algorithm")
    if args.png:
        raise UserError("--png", "ring_attention has a page (--html) and text (--explain), "
                                 "no slides")
    if args.json and args.explain:
        raise UserError("--json", "cannot be combined with --explain")
    if args.ranks > MAX_LESSON_RANKS:
        raise UserError("--ranks", f"the lesson draws every rank and chunk: use at most "
                                   f"{MAX_LESSON_RANKS} CP ranks, got {args.ranks}")
    if args.html:
        check_out_file(args.html, "--html")


def _run_ring_attention(args) -> int:
    """The ring attention lesson: the step table, --explain's text, --json, --html's page (the
    lesson's modules, with the CP ring they run, are imported only for this collective)."""
    from simsp.report.lessons import ring_attention_text
    from simsp.report.lessons.ring_attention import cluster_lesson
    from simsp.report.lessons.ring_attention_page import write_page as write_attention_page
    _check_ring_attention(args)
    cluster, gpus = ring_placement(args.ranks, args.nodes, system_cluster(args.system))
    data = cluster_lesson(cluster, gpus, attention_shape(args))
    if args.html:
        write_attention_page(data, args.html)
    if args.json:
        print(dumps(data))
        return 0
    lines = ring_attention_text.lesson_text(data) + [""] if args.explain else []
    print("\n".join(lines + ring_attention_text.step_table(data)))
    return 0


def _forced(args) -> LinkCalibration:
    """The default link calibration with the forced NCCL algorithm and protocol, if any."""
    return LinkCalibration(nccl_algo=None if args.nccl_algo == AUTO else args.nccl_algo,
                           nccl_proto=None if args.nccl_proto == AUTO else args.nccl_proto)
