"""The ring attention lesson: context parallelism's ring carrying K and V, as one model rendered
as the text of `simsp ring --collective ring_attention --explain` (ring_attention_text.py) and
as a teaching page (ring_attention_page.py).

The pieces are simsp's own: the 2·cp load-balanced split of model/context_split.py (rank r holds
chunks r and 2cp−1−r), whose K/V block each rank holds at each step (training/context_parallel/ring_kernels.py,
Transformer Engine's AttnFuncWithCPAndKVP2P: forward step i holds rank r−i's; the backward walks
the forward's steps in reverse, holding rank r+1+i's, so its diagonal block comes last), and the
timeline of training/context_parallel/ring.py run on the modelled links (exchange bytes, rendezvous, overlap
with the block compute of training/cp_ring.block_seconds). docs/context-parallel.md has the
science.
"""

import contextlib
from dataclasses import dataclass

import simpy

from simsp.cluster.topology import build_topology, hop_route, route_latency_s
from simsp.hardware.costmodel import active_calibration, gemm_rate
from simsp.hardware.costmodel import calibration as compute_calibration
from simsp.engine.network import Network
from simsp.hardware.constants import LinkCalibration, cluster_compute
from simsp.model.context_split import chunk_count, chunk_ids
from simsp.training.context_parallel.ring_kernels import source_rank
from simsp.report.lessons import RING_ATTENTION
from simsp.report.lessons.ring import LINKS, microseconds
from simsp.training.context_parallel.ring import (CpRing, block_gemm, block_seconds,
                                                  exchange_bytes, run_ring)
from simsp.units import format_bytes

ELEM_BYTES = 2  # BF16 K and V
PHASES = ("forward", "backward")
FULL, DIAGONAL = "full", "diagonal"  # a (query chunk, key chunk) block: all pairs, or causal half
WHAT_MOVES = {("forward", "kv"): "K/V", ("backward", "kv"): "K/V", ("backward", "both"):
              "K/V + dK/dV", ("backward", "dkv"): "dK/dV"}


@dataclass(frozen=True)
class AttentionShape:
    """One TP rank's attention in a micro-batch: Megatron's flags, per TP rank."""

    seq_length: int  # s, the whole sequence
    heads: int  # query heads on this TP rank (a / t)
    kv_heads: int  # K/V heads on this TP rank (G / t)
    head_dim: int  # d (--kv-channels)
    micro_batch: int  # b

    def local_tokens(self, cp: int) -> int:
        """Tokens a CP rank holds: s / cp (two chunks of s / 2cp)."""
        return self.seq_length // cp

    def kv_bytes(self, cp: int) -> int:
        """One rank's K/V block: K and V of its s/cp tokens, 2·b·G·(s/cp)·d BF16 values."""
        return 2 * self.micro_batch * self.kv_heads * self.local_tokens(cp) * self.head_dim \
            * ELEM_BYTES


# ---------------------------------------------------------------------------------------------
# Which blocks each rank computes
# ---------------------------------------------------------------------------------------------

def held_rank(phase: str, rank: int, step: int, cp: int) -> int:
    """Whose K/V block `rank` holds at `step`: rank − step forward (source_rank); rank + 1 +
    step backward (the forward's last block first, its own last)."""
    if phase == "forward":
        return source_rank(rank, step, cp)
    return (rank + 1 + step) % cp


def chunk_blocks(cp: int, rank: int, source: int) -> list[list]:
    """[query chunk, key chunk, FULL or DIAGONAL] of every block with a visible pair when `rank`
    meets `source`'s K/V under the 2cp split: a key chunk before the query chunk is seen whole,
    the same chunk is its causal triangle, a later one not at all."""
    blocks = []
    for q in chunk_ids(cp, rank):
        for k in chunk_ids(cp, source):
            if k <= q:
                blocks.append([q, k, FULL if k < q else DIAGONAL])
    return blocks


def block_pairs(blocks: list[list], chunk_tokens: int) -> int:
    """(query, key) pairs in `blocks`: c² for a full block, c(c + 1)/2 for a diagonal one."""
    c = chunk_tokens
    return sum(c * c if kind == FULL else c * (c + 1) // 2 for _q, _k, kind in blocks)


def plain_split_pairs(s: int, cp: int) -> list[int]:
    """Causal pairs each rank computes over the whole ring when the sequence is cut into cp
    plain pieces: rank r sees r whole blocks before it and its own triangle."""
    n = s // cp
    return [r * n * n + n * (n + 1) // 2 for r in range(cp)]


# ---------------------------------------------------------------------------------------------
# The timeline on the links
# ---------------------------------------------------------------------------------------------

def step_block_seconds(shape: AttentionShape, cp: int, phase: str, rank: int,
                       step: int) -> float:
    """The block attention time of `rank` at `step` (training/cp_ring.block_seconds: the whole
    local block at the diagonal, half of it otherwise)."""
    diagonal = held_rank(phase, rank, step, cp) == rank
    return block_seconds(shape.micro_batch, shape.heads, shape.local_tokens(cp), shape.head_dim,
                         diagonal, phase == "backward")


def ring_timeline(graph, gpus: list[int], shape: AttentionShape,
                  calibration: LinkCalibration) -> tuple:
    """(RingTimeline, transfers) of one CP group's forward and backward on the links."""
    cp = len(gpus)
    env = simpy.Environment()
    network = Network(env, graph, calibration)
    ring = CpRing(env, network, tuple(gpus), shape.kv_bytes(cp))
    times = {phase: [[step_block_seconds(shape, cp, phase, r, i) for i in range(cp)]
                     for r in range(cp)] for phase in PHASES}
    timeline = run_ring(env, ring, times["forward"], times["backward"])
    return timeline, network.transfers


def transfer_derivation(graph, gpus: list[int], phase: str, nbytes: int,
                        calibration: LinkCalibration) -> dict:
    """The slowest of a step's concurrent sends (every rank to its ring neighbour) as a formula:
    latency + bytes ÷ (bandwidth × efficiency ÷ sends sharing the link) (engine/network.py's
    max-min fair share, all sends starting together)."""
    cp, to = len(gpus), 1 if phase == "forward" else -1
    routes = [hop_route(graph, gpus[r], gpus[(r + to) % cp]) for r in range(cp)]
    load: dict = {}
    for edge in (e for route in routes for e in route):
        load[edge] = load.get(edge, 0) + 1

    def rate(edge) -> float:
        """The link's share for one of the sends crossing it."""
        data = graph.edges[edge]
        return data["bandwidth_Bps"] * calibration.efficiency(data["kind"]) / load[edge]

    def seconds(route) -> float:
        """One send alone on its route at those shares."""
        latency = route_latency_s(graph, route) + calibration.transfer_overhead_s
        return latency + nbytes / min(rate(e) for e in route)

    src = max(range(cp), key=lambda r: seconds(routes[r]))
    route = routes[src]
    bottleneck = min(route, key=rate)
    kind = graph.edges[bottleneck]["kind"]
    latency_s = route_latency_s(graph, route) + calibration.transfer_overhead_s
    bandwidth_GBps = graph.edges[bottleneck]["bandwidth_Bps"] / 1e9
    shared = f" ÷ {load[bottleneck]}" if load[bottleneck] > 1 else ""
    time_s = seconds(route)
    formula = (f"{microseconds(time_s)} = {format_bytes(nbytes)} ÷ ({bandwidth_GBps:g} GB/s × "
               f"{calibration.efficiency(kind):g}{shared}) + {microseconds(latency_s)}")
    return {"src": gpus[src], "dst": gpus[(src + to) % cp], "link": LINKS[kind],
            "time_s": time_s, "formula": formula}


def compute_derivation(shape: AttentionShape, cp: int, diagonal: bool, backward: bool) -> dict:
    """A block's attention time as the cost model prices it: 2 (forward) or 5 (backward) batched
    GEMMs of 2·b·heads·m·k·n FLOPs at the calibrated rate, each with its launch."""
    m, k, n = block_gemm(shape.local_tokens(cp), shape.head_dim, diagonal)
    cal = active_calibration()
    gemms = 5 if backward else 2
    flops = 2 * shape.micro_batch * shape.heads * m * k * n
    rate = gemm_rate((m, k, n), cal, shape.micro_batch * shape.heads)  # the batch: b·heads
    time_s = gemms * (cal.launch_overhead_s + flops / rate)
    formula = (f"{microseconds(time_s)} = {gemms} GEMMs × ({flops / 1e9:.4g} GFLOP ÷ "
               f"{rate / 1e12:.4g} TFLOP/s + {microseconds(cal.launch_overhead_s)})")
    return {"time_s": time_s, "gemm": [m, k, n], "gemms": gemms, "formula": formula}


# ---------------------------------------------------------------------------------------------
# The lesson's steps
# ---------------------------------------------------------------------------------------------

def _moving(phase: str, step: int, cp: int) -> str:
    """What travels at this step: K/V, K/V + dK/dV, dK/dV, or nothing (the forward's last)."""
    if exchange_bytes(phase, step, cp, 1) == 0:
        return ""
    if phase == "forward" or step == 0:
        return WHAT_MOVES[phase, "kv"]
    return WHAT_MOVES[phase, "dkv" if step == cp - 1 else "both"]


def carried(phase: str, step: int, cp: int) -> list[list]:
    """Per rank, [whose K/V, whose dK/dV] its send carries (None: not carried). Forward: the
    block it holds. Backward (TE's buffers): the block it holds, on to rank r − 1 which needs
    it next, and from step 1 the dK/dV of the block it held before, with its share added;
    the last step's dK/dV reaches that block's owner."""
    kv = [held_rank(phase, r, step, cp) for r in range(cp)]
    if phase == "forward":
        return [[j if step < cp - 1 else None, None] for j in kv]
    before = [held_rank(phase, r, step - 1, cp) if step else None for r in range(cp)]
    return [[j if step < cp - 1 else None, k] for j, k in zip(kv, before)]


def carried_text(pair: list) -> str:
    """'K/V of r3 + dK/dV of r2', 'K/V of r3', 'dK/dV of r2'."""
    kv, dkv = pair
    parts = ([f"K/V of r{kv}"] if kv is not None else []) + (
        [f"dK/dV of r{dkv}"] if dkv is not None else [])
    return " + ".join(parts)


def _compute_order(cp: int) -> list[tuple[str, int]]:
    """Every (phase, step) a rank computes, in order."""
    return [(phase, i) for phase in PHASES for i in range(cp)]


def _exposed(timeline, cp: int) -> dict:
    """{(phase, step): the longest a rank waits after that step's block for the exchange}: the
    gap to its next block (or the end of its backward)."""
    order, gaps = _compute_order(cp), {}
    for r in range(cp):
        for j, (phase, step) in enumerate(order):
            end = timeline.compute[(phase, r, step)][1]
            nxt = (timeline.compute[(order[j + 1][0], r, order[j + 1][1])][0]
                   if j + 1 < len(order) else timeline.ends[("backward", r)])
            gaps[phase, step] = max(gaps.get((phase, step), 0.0), nxt - end)
    return gaps


def _transfer_seconds(transfers, phase: str, step: int) -> float:
    """The longest simulated send of a step (0 when nothing moves)."""
    tag = f"cp {phase} step {step} "
    return max((t.end_s - t.start_s for t in transfers if t.label.startswith(tag)), default=0.0)


def lesson_steps(graph, gpus: list[int], shape: AttentionShape,
                 calibration: LinkCalibration) -> tuple[list[dict], float]:
    """(every forward then backward step, the backward's end): K/V held per rank, the blocks
    computed, what moves, bytes, the send's time derived and simulated, the block compute
    derived, the wait."""
    cp = len(gpus)
    timeline, transfers = ring_timeline(graph, gpus, shape, calibration)
    exposed, steps = _exposed(timeline, cp), []
    for phase, step in _compute_order(cp):
        held = [held_rank(phase, r, step, cp) for r in range(cp)]
        nbytes = exchange_bytes(phase, step, cp, shape.kv_bytes(cp))
        to = 1 if phase == "forward" else -1
        diagonal = held[0] == 0
        starts = [timeline.compute[(phase, r, step)][0] for r in range(cp)]
        steps.append({
            "phase": phase, "index": step, "held": held,
            "blocks": [[*block, r] for r in range(cp) for block in chunk_blocks(cp, r, held[r])],
            "moves": _moving(phase, step, cp), "bytes_per_rank": nbytes,
            "carried": [carried_text(pair) for pair in carried(phase, step, cp)] if nbytes
            else [],
            "sends": [[r, (r + to) % cp] for r in range(cp)] if nbytes else [],
            "transfer": (transfer_derivation(graph, gpus, phase, nbytes, calibration)
                         if nbytes else None),
            "transfer_s": _transfer_seconds(transfers, phase, step),
            "compute": compute_derivation(shape, cp, diagonal, phase == "backward"),
            "start_s": min(starts), "exposed_s": exposed[phase, step]})
        steps[-1]["verdict"] = hidden_sentence(steps[-1])
    return steps, max(timeline.ends[("backward", r)] for r in range(cp))


def ring_links(graph, gpus: list[int]) -> list[str]:
    """The link kind of each rank's hop to the next ('InfiniBand' when it leaves the node)."""
    kinds = []
    for r, gpu in enumerate(gpus):
        edges = hop_route(graph, gpu, gpus[(r + 1) % len(gpus)])
        kinds.append(LINKS["ib"] if any(graph.edges[e]["kind"] == "ib" for e in edges)
                     else LINKS["nvlink"])
    return kinds


def lesson_data(graph, gpus: list[int], shape: AttentionShape,
                calibration: LinkCalibration | None = None) -> dict:
    """Everything the text and the page show, JSON-ready."""
    calibration = calibration or LinkCalibration()
    cp, per_node = len(gpus), graph.graph["gpus_per_node"]
    c = shape.seq_length // chunk_count(cp)
    steps, end_s = lesson_steps(graph, gpus, shape, calibration)
    balanced = [sum(block_pairs([b[:3] for b in step["blocks"] if b[3] == r], c)
                    for step in steps if step["phase"] == "forward") for r in range(cp)]
    return {"collective": RING_ATTENTION, "cp": cp, "gpus": list(gpus),
            "nodes": len({g // per_node for g in gpus}), "gpus_per_node": per_node,
            "links": ring_links(graph, gpus),
            "seq_length": shape.seq_length, "heads": shape.heads, "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim, "micro_batch": shape.micro_batch,
            "chunks": chunk_count(cp), "chunk_tokens": c,
            "owned": [list(chunk_ids(cp, r)) for r in range(cp)],
            "kv_bytes": shape.kv_bytes(cp), "calibration": calibration.describe(),
            "steps": steps, "end_s": end_s,
            "balance": {"balanced_pairs": balanced,
                        "plain_pairs": plain_split_pairs(shape.seq_length, cp),
                        "causal_pairs": shape.seq_length * (shape.seq_length + 1) // 2}}


def cluster_lesson(cluster, gpus: list[int], shape: AttentionShape) -> dict:
    """lesson_data on the links of `cluster` (scenario.config.Cluster), the blocks priced by its
    system's GPU (hardware/constants.py cluster_compute; None: the A100 fit)."""
    compute = cluster_compute(cluster)
    with compute_calibration(compute) if compute else contextlib.nullcontext():
        return lesson_data(build_topology(cluster), gpus, shape,
                           LinkCalibration.from_cluster(cluster))


def lesson_title(data: dict) -> str:
    """'Ring attention over CP = 4 ranks (1 node): s = 8192'."""
    nodes = data["nodes"]
    return (f"Ring attention over CP = {data['cp']} ranks ({nodes} node"
            f"{'s' if nodes > 1 else ''}): s = {data['seq_length']}")


def hidden_sentence(step: dict) -> str:
    """Whether the step's send hid behind its block compute, with both times."""
    compute = step["compute"]["time_s"]
    if not step["bytes_per_rank"]:
        return f"nothing to send: {microseconds(compute)} of compute"
    moved = step["transfer_s"]
    if step["exposed_s"] <= 1e-12:
        return (f"hidden: the send takes {microseconds(moved)} under {microseconds(compute)} "
                f"of block compute")
    return (f"exposed: the send takes {microseconds(moved)}, the block compute "
            f"{microseconds(compute)}: the ring waits {microseconds(step['exposed_s'])}")
