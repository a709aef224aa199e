"""`simsp ring`: time ring collectives on the simulated cluster, in the style of nccl-tests.

    simsp ring --ranks N [--nodes K] [--collective C] (--size S | --min-size A --max-size B
               [--step-factor F]) [--nccl-algo {auto,ring,tree}]
               [--nccl-proto {auto,LL,LL128,Simple}] [--explain] [--json]

Every size runs as NCCL would pick it (engine/collectives/nccl_tuning.py: algorithm, protocol, channels;
NCCL_ALGO / NCCL_PROTO force them). Rings are simulated step by step (meta mode) over the
cluster's links, as NCCL's channels (one ring per GPU a node holds, laid out rail by rail across
nodes); rings of more than 32 ranks are timed alone on their links as meta mode times them
(engine/collectives/ring_alone.py: in closed form where no link carries two of their hops, else one node's
piece of one channel step by step where the ring is symmetric, else in closed form, an upper
bound: docs/shortcuts.md); tree all-reduces in closed form (ring_timing.tree_time). The table shows nccl-tests' size, count,
time, algbw and busbw (GB/s = 1e9 bytes/s, NCCL PERFORMANCE.md) and the algorithm, protocol and
channels NCCL runs; a single size adds the per-channel breakdown of a ring.
"""

import contextlib
import math
from dataclasses import replace
from pathlib import Path

import simpy

from simsp.scenario.limits import check_field
from simsp.cluster.topology import build_topology
from simsp.scenario.config import Cluster
from simsp.engine.collectives.all_to_all import time_all_to_all
from simsp.engine.collectives.ring import RING_COLLECTIVES, CollectiveStats
from simsp.engine.collectives.nccl_group import nccl_choice
from simsp.engine.collectives.nccl_tuning import PROTOCOLS, RING, TREE
from simsp.engine.network import Network
from simsp.engine.collectives.nvls import (NVLS, NVLS_EFFICIENCY, NVLS_LATENCY_S, nvls_all_reduce_time,
                               nvls_available, nvls_bytes_per_direction)
from simsp.engine.collectives.ring_plan import ALL_GATHER, ALL_REDUCE, COLLECTIVES, REDUCE_SCATTER
from simsp.engine.collectives.ring_alone import alone_stats
from simsp.engine.collectives.ring_timing import algbw_GBps, busbw_GBps, tree_time
from simsp.errors import UserError
from simsp.scenario.flags import nonempty
from simsp.hardware.profiles import gpu_profile, nvswitch_generation, system_cluster_fields
from simsp.hardware.costmodel import calibration as compute_calibration
from simsp.hardware.constants import LinkCalibration, cluster_compute
from simsp.io_out import check_folder, check_out_file, write_file
from simsp.jsonout import dumps
from simsp.outdir import prepare_out_dir
from simsp.progress import track
from simsp.report.all_to_all_table import ALL_TO_ALL, json_result, table_lines
from simsp.report.ring_lesson import (MAX_LESSON_RANKS, lesson_data, lesson_text, lesson_title,
                                     write_slides)
from simsp.report.ring_lesson_page import lesson_html
from simsp.report import ring_attention_lesson, ring_attention_page
from simsp.report.ring_attention_lesson import RING_ATTENTION, AttentionShape
from simsp.units import parse_size

ELEM_BYTES = 4  # nccl-tests' default datatype: float (32-bit)
AUTO = "auto"
MAX_EXPLAIN_RANKS = 8
STEPWISE_MAX_RANKS = 32  # larger rings: ring_alone (the stepwise ring costs ~n^2 flow events)
ALONE_WORDS = "timed alone: closed form, or one node's piece step by step"
# The closed form plans n x channels hops per phase; 8192 ranks (on 1024 nodes) take ~1 s.
MAX_RING_RANKS = 8192
MAX_ALL_TO_ALL_RANKS = 64  # n(n - 1) transfers at once: 4032 at 64 ranks
BUS_FACTOR_TEXT = {ALL_REDUCE: "2(n-1)/n", REDUCE_SCATTER: "(n-1)/n", ALL_GATHER: "(n-1)/n"}


def add_parser(subparsers) -> None:
    """Register `simsp ring` and its flags."""
    parser = subparsers.add_parser("ring", help="time ring collectives (nccl-tests style)",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, required=True, help="ranks in the ring")
    parser.add_argument("--nodes", type=int, default=None,
                        help="DGX nodes, ranks spread evenly (default: ceil(ranks/8))")
    parser.add_argument("--collective", choices=COLLECTIVES + (ALL_TO_ALL, RING_ATTENTION),
                        default=ALL_REDUCE)
    parser.add_argument("--size", default=None, help="one message size: 8, 256K, 1M, 1G")
    parser.add_argument("--min-size", default=None, help="smallest size of a sweep")
    parser.add_argument("--max-size", default=None, help="largest size of a sweep")
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
    _add_ring_attention_flags(parser)
    parser.set_defaults(handler=run)


def run(args) -> int:
    """Check the flags, simulate every size, print the table, explanation or JSON."""
    if args.collective == RING_ATTENTION:
        return _run_ring_attention(args)
    _refuse_attention_flags(args)
    sizes = _sizes(args)
    cluster, gpus = _placement(args.ranks, args.nodes, _system_cluster(args.system))
    if args.collective == ALL_TO_ALL:
        return _run_all_to_all(args, sizes, cluster, gpus)
    _check_modes(args, sizes)
    _check_algo(args, cluster, gpus)
    if args.nccl_algo == NVLS:
        return _run_nvls(args, cluster, gpus, sizes)
    graph = build_topology(cluster)
    calibration = _forced(args)
    if args.html or args.png:
        write_ring_lesson(args.collective, graph, gpus, sizes[0], args.html, args.png)
    if args.json:
        print(dumps(_json_result(args.collective, simulate_nccl(graph, gpus, args.collective,
                                                                sizes[0], calibration))))
        return 0
    if args.explain:
        data = lesson_data(args.collective, graph, gpus, sizes[0], ELEM_BYTES)
        print("\n".join(lesson_text(data)))
        print()
    quiet = getattr(args, "quiet", False) or len(sizes) < 2
    rows = [simulate_nccl(graph, gpus, args.collective, size, calibration)
            for size in track(sizes, "sizes", "size", quiet)]
    lines = (_header(args.collective, cluster, gpus, calibration) + _table(rows)
             + _nccl_pick(cluster, rows))
    if len(rows) == 1 and rows[0].channels:
        lines += channel_lines(rows[0], cluster.gpus_per_node)
    print("\n".join(lines))
    return 0


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
    """nccl-tests' alltoall_perf table (report/all_to_all_table.py)."""
    _check_all_to_all(args)
    if args.json and len(sizes) > 1:
        raise UserError("--json", "needs a single --size")
    graph, calibration = build_topology(cluster), LinkCalibration.from_cluster(cluster)
    quiet = getattr(args, "quiet", False) or len(sizes) < 2
    rows = [time_all_to_all(graph, gpus, size, calibration)
            for size in track(sizes, "sizes", "size", quiet)]
    if args.json:
        print(dumps(json_result(len(gpus), *rows[0])))
    else:
        print("\n".join(table_lines(cluster, gpus, rows, calibration.describe())))
    return 0


def _nccl_pick(cluster: Cluster, rows: list[CollectiveStats]) -> list[str]:
    """On an NVSwitch-3+ domain NCCL also weighs NVLS for an all-reduce and takes the fastest
    (tuning.cc): name the faster of the row above and NVLS per size. Nothing where NVLS cannot
    run (training runs weigh it the same way: engine/collectives/nvls.py nvls_in_group)."""
    if not rows or rows[0].collective != ALL_REDUCE or nvls_available(
            nvswitch_generation(cluster), gpu_profile(cluster.gpu).nvlink_generation,
            cluster.nodes):
        return []
    lines = ["# NVLS (NVLink SHARP) can run here; the faster of the row above and nvls per "
             "size (--nccl-algo nvls prints its table):"]
    for row in rows:
        nvls = _nvls_stats(cluster, list(row.gpus), row.nbytes)
        lines.append(f"#   {row.nbytes:>10} B: {row.algorithm}/{row.protocol} "
                     f"{row.time_s * 1e6:.2f} us, nvls {nvls.time_s * 1e6:.2f} us -> "
                     f"{NVLS if nvls.time_s < row.time_s else row.algorithm}")
    return lines


def write_ring_lesson(collective: str, graph, gpus: list[int], nbytes: int, html_path=None,
                      png_dir=None) -> list[Path]:
    """--html FILE / --png DIR: the lesson (report/ring_lesson.py) as a page and/or slides."""
    if len(gpus) > MAX_LESSON_RANKS:
        raise UserError("--html" if html_path else "--png", f"the lesson draws every rank and "
                        f"chunk: use at most {MAX_LESSON_RANKS} ranks, got {len(gpus)}")
    data = lesson_data(collective, graph, gpus, nbytes)
    written = []
    if html_path:
        path = Path(html_path)
        write_file(path, lesson_html(data, lesson_title(data)))
        written.append(path)
    if png_dir:
        written += write_slides(data, png_dir)
    return written


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


def _system_cluster(system: str | None) -> Cluster:
    """One node of `system` (its GPUs per NVLink domain and link speeds), or a DGX A100."""
    if system is None:
        return Cluster()
    return replace(Cluster(), system=system, **system_cluster_fields(system))


def _placement(ranks: int, nodes: int | None,
               base: Cluster = Cluster()) -> tuple[Cluster, list[int]]:
    """Cluster and GPUs of the ring: ranks spread evenly over the nodes, in order."""
    gpus_per_node = base.gpus_per_node
    if ranks < 2:
        raise UserError("--ranks", f"a ring needs at least 2 ranks, got {ranks}")
    if ranks > MAX_RING_RANKS:
        raise UserError("--ranks", f"a ring of {ranks} ranks plans ~{ranks * gpus_per_node} "
                                   f"channel hops for each of its {2 * (ranks - 1)} steps; the "
                                   f"limit is {MAX_RING_RANKS} ranks")
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
    return replace(base, nodes=nodes), gpus


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
    """NVLS all-reduce at every size (closed form, simsp/engine/collectives/nvls.py), beside what NCCL's
    modelled choice among ring and tree (engine/collectives/nccl_tuning.py) does at the same sizes."""
    rows = [_nvls_stats(cluster, gpus, size) for size in sizes]
    if args.json:
        print(dumps(_json_result(ALL_REDUCE, rows[0])))
        return 0
    graph = build_topology(cluster)
    others = [simulate_nccl(graph, gpus, ALL_REDUCE, size, LinkCalibration.from_cluster(cluster))
              for size in sizes]
    header = _header(ALL_REDUCE, cluster, gpus)
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
    print("\n".join(header + _table(rows) + choice))
    return 0


def _nvls_stats(cluster: Cluster, gpus: list[int], nbytes: int) -> CollectiveStats:
    """An NVLS all-reduce's stats: one switch reduction, S(1 + 1/n) sent by every GPU."""
    n, gpu = len(gpus), gpu_profile(cluster.gpu)
    seconds = nvls_all_reduce_time(nbytes, n, cluster.nvlink_bandwidth_GBps,
                                   cluster.nvlink_efficiency, gpu.nvlink_generation)
    sent = (round(nvls_bytes_per_direction(nbytes, n)),) * n
    return CollectiveStats(ALL_REDUCE, tuple(gpus), nbytes, 1, sent, sent, 0.0, seconds, (),
                           NVLS, "Simple", 0)


# --------------------------------------------------------------------------------------------
# Ring attention: context parallelism's ring carrying K and V (report/ring_attention_lesson.py)
# --------------------------------------------------------------------------------------------

# flag -> (argparse dest, default: Llama 3 70B's attention, meaning)
ATTENTION_FLAGS = {
    "--seq-length": ("seq_length", 8192, "tokens in the sequence the CP ranks share"),
    "--num-attention-heads": ("num_attention_heads", 64, "query heads of the layer"),
    "--num-query-groups": ("num_query_groups", 8, "K/V heads (group-query attention)"),
    "--kv-channels": ("kv_channels", 128, "head dimension"),
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", 8,
                                     "TP ranks sharing the heads"),
    "--micro-batch-size": ("micro_batch_size", 1, "sequences per micro-batch")}


def _add_ring_attention_flags(parser) -> None:
    """The attention whose K/V the ring carries, by Megatron-LM's flags."""
    group = parser.add_argument_group("--collective ring_attention (Megatron-LM's flags; "
                                      "defaults: Llama 3 70B)")
    for flag, (dest, default, meaning) in ATTENTION_FLAGS.items():
        group.add_argument(flag, dest=dest, type=int, default=None,
                           help=f"{meaning} (default {default})")


def _refuse_attention_flags(args) -> None:
    """The attention flags describe ring_attention only."""
    for flag, (dest, _default, _meaning) in ATTENTION_FLAGS.items():
        if getattr(args, dest) is not None:
            raise UserError(flag, "describes --collective ring_attention only")


def _attention_shape(args) -> AttentionShape:
    """One TP rank's attention from the flags (defaults filled), checked."""
    value = {dest: default if getattr(args, dest) is None else getattr(args, dest)
             for dest, default, _meaning in ATTENTION_FLAGS.values()}
    for flag, (dest, _default, _meaning) in ATTENTION_FLAGS.items():
        if value[dest] < 1:
            raise UserError(flag, f"must be positive, got {value[dest]}")
        section = "parallel" if dest in ("tensor_model_parallel_size", "micro_batch_size") \
            else "model"
        try:  # the range table run uses (a 10**12-token sequence printed 10**50-byte blocks)
            check_field(f"{section}.{dest}", value[dest])
        except UserError as exc:
            raise UserError(flag, exc.reason) from None
    t, chunks = value["tensor_model_parallel_size"], 2 * args.ranks
    if value["seq_length"] % chunks:
        raise UserError("--seq-length", f"{value['seq_length']} tokens do not cut into "
                                        f"2 x cp = {chunks} equal chunks")
    for flag, dest in (("--num-attention-heads", "num_attention_heads"),
                       ("--num-query-groups", "num_query_groups")):
        if value[dest] % t:
            raise UserError(flag, f"{value[dest]} heads do not split over "
                                  f"--tensor-model-parallel-size {t}")
    if value["num_attention_heads"] % value["num_query_groups"]:
        raise UserError("--num-query-groups", "must divide --num-attention-heads")
    return AttentionShape(value["seq_length"], value["num_attention_heads"] // t,
                          value["num_query_groups"] // t, value["kv_channels"],
                          value["micro_batch_size"])


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
    """The ring attention lesson: the step table, --explain's text, --json, --html's page."""
    _check_ring_attention(args)
    cluster, gpus = _placement(args.ranks, args.nodes, _system_cluster(args.system))
    shape = _attention_shape(args)
    compute = cluster_compute(cluster)  # the system's GPU prices the blocks (None: the A100 fit)
    with compute_calibration(compute) if compute else contextlib.nullcontext():
        data = ring_attention_lesson.lesson_data(build_topology(cluster), gpus, shape,
                                                 LinkCalibration.from_cluster(cluster))
    if args.html:
        write_file(Path(args.html), ring_attention_page.lesson_html(
            data, ring_attention_lesson.lesson_title(data)))
    if args.json:
        print(dumps(data))
        return 0
    lines = ring_attention_lesson.lesson_text(data) + [""] if args.explain else []
    print("\n".join(lines + ring_attention_lesson.step_table(data)))
    return 0


def _forced(args) -> LinkCalibration:
    """The default link calibration with the forced NCCL algorithm and protocol, if any."""
    return LinkCalibration(nccl_algo=None if args.nccl_algo == AUTO else args.nccl_algo,
                           nccl_proto=None if args.nccl_proto == AUTO else args.nccl_proto)


# --------------------------------------------------------------------------------------------
# Simulation and output
# --------------------------------------------------------------------------------------------

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


def _json_result(collective: str, stats: CollectiveStats) -> dict:
    """The --json object: exactly the documented keys."""
    n = len(stats.gpus)
    return {"collective": collective, "ranks": n, "size_bytes": stats.nbytes,
            "time_s": stats.time_s, "algbw_GBps": algbw_GBps(stats.nbytes, stats.time_s),
            "busbw_GBps": busbw_GBps(collective, n, stats.nbytes, stats.time_s),
            "bytes_sent_per_rank": list(stats.bytes_sent), "steps": stats.steps,
            "algorithm": stats.algorithm, "protocol": stats.protocol,
            "nchannels": stats.nchannels}


def _header(collective: str, cluster: Cluster, gpus: list[int],
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
                     f"{algbw_GBps(stats.nbytes, stats.time_s):>8.2f} {busbw:>8.2f} "
                     f"{stats.algorithm:>5} {stats.protocol:>6} {stats.nchannels:>4}")
    lines.append(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.3f}")
    return lines


# --------------------------------------------------------------------------------------------
# Per-channel breakdown
# --------------------------------------------------------------------------------------------

def channel_lines(stats: CollectiveStats, gpus_per_node: int) -> list[str]:
    """Per NCCL channel: ring order, the rail its node crossings use, bytes and time."""
    nics = _nics_per_node(stats, gpus_per_node)
    lines = [f"# {len(stats.channels)} channel(s) (NCCL rings; across nodes one per GPU a node "
             f"holds, rail by rail); NICs sending per node: {nics}",
             "# ring order: | = node crossing, ^N = relayed through gpuN's NIC over NVLink (PXN)",
             f"# {'channel':>7} {'rail':>4} {'bytes':>12} {'sent/GPU':>12} {'time (us)':>10}"
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
