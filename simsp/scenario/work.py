"""The size of the work, estimated before anything runs: simulated layer-steps, numeric-mode
bytes, meta-mode CPU seconds and bytes, per axis of the layout; check_work refuses work beyond
the limits.

The limits are what this machine (2 cores, 24 GiB) does in reasonable time and memory;
`--force` lifts the time limit, never the memory limit. The constants and their sources are in
simsp/scenario/work_constants.py.
"""

from typing import NamedTuple

from simsp.errors import UserError
from simsp.scenario.config import bucket_size, sms_shared
from simsp.scenario.pipeline_split import model_chunks
from simsp.scenario.work_constants import (  # noqa: F401 (re-exported)
    META_SECONDS_PER_LAYER_STEP, META_SECONDS_PER_LAYER_STEP_PER_REPLICA, META_SECONDS_PER_CHUNK_STEP,
    FULL_SECONDS_PER_RANK_STEP, NUMERIC_FLOPS_PER_SECOND, NUMERIC_SECONDS_PER_LAYER_STEP,
    META_BYTES_PER_LAYER_STEP, PLAN_SECONDS_PER_RANK_LAYER, PLAN_BYTES_PER_RANK_LAYER,
    FULL_BYTES_PER_RANK_STEP, FULL_BYTES_PER_RING_STEP, FULL_BYTES_PER_RANK_LAYER,
    FULL_BYTES_PER_RANK,
    FULL_SECONDS_PER_RING_RANK, SECONDS_PER_BUCKET, FSDP_SECONDS_PER_COLLECTIVE_D2,
    FSDP_SECONDS_PER_FLOW, PIECE_SECONDS_PER_FLOW, TRAIN_SECONDS_PER_STEP,
    TRAIN_SECONDS_PER_COLLECTIVE, FSDP_SECONDS_PER_COLLECTIVE_PIECE, CP_SECONDS_PER_RANK_PAIR,
    CP_SECONDS_PER_RANK_STEP, CP_LONE_SECONDS_PER_RANK_PAIR, CP_PASS_SECONDS_PER_RANK_PAIR,
    CP_TEMPLATE_SECONDS_PER_RANK_STEP, CP_SHADOW_SECONDS_PER_LEADER_STEP,
    CP_SHADOW_SECONDS_PER_RANK_STEP, CP_SHADOW_SECONDS_PER_RANK_PAIR, CP_CHECK_SECONDS_PER_MEMBER,
    EXCHANGE_SECONDS_PER_FLOW,
    EP_SECONDS_PER_RANK_PAIR, EP_SECONDS_PER_RANK_PAIR_SQUARED, SECONDS_PER_FLOW_VISIT,
    SECONDS_PER_GATHER_FLOW, A2A_ALONE_SECONDS_PER_FLOW, CHECK_SECONDS_PER_MEMBER,
    MTP_SECONDS_PER_DEPTH_STEP, SECONDS_PER_FLOW, RUN_START_SECONDS, TIME_LIMIT_S,
    MEMORY_LIMIT_BYTES)
from simsp.scenario.work_bytes import DetailSpans, detail_bytes, full_bytes  # noqa: F401
from simsp.units import format_bytes

# the schedules whose backward is split into B and W, their sends non-blocking
# (training/pipeline/schedules.py SPLIT_BACKWARD, which this layer may not import)
SPLIT_BACKWARD_SCHEDULES = ("zb-h1", "zb-h2", "zbv", "dualpipev", "dualpipe")


def layer_steps(sc) -> int:
    """Layer-steps one meta iteration simulates with the representative shortcut: each of the p
    simulated stages runs its L/p layers forward and backward for each of the m micro-batches."""
    return sc.model.num_layers * sc.parallel.num_micro_batches


def chunk_steps(sc) -> int:
    """Schedule steps of one iteration on one rank per stage: each micro-batch's forward (and
    its backward) through every model chunk it crosses, each a step of the schedule with its
    pipeline transfer: m x v x p (v chunks per stage, pipeline_split.model_chunks; DualPipe's
    two chunks per rank each carry half the micro-batches, docs/dualpipe.md: m x p)."""
    p = sc.parallel
    chunks = 1 if p.schedule_name == "dualpipe" else model_chunks(sc.model, p)
    return p.num_micro_batches * chunks * p.pp


def mtp_steps(sc) -> int:
    """Multi-token prediction depth-steps of one iteration: D depths x m micro-batches (the
    last stage only; docs/mtp.md)."""
    return (sc.model.mtp_num_layers or 0) * sc.parallel.num_micro_batches


def param_count(m) -> int:
    """Parameters: 4h^2 + 2hf + 9h + f per layer, (v + s)h embeddings, 2h final norm
    (N21 Eq. 2 with ffn f; model/params.py's shapes)."""
    h, f = m.hidden_size, m.ffn
    per_layer = 4 * h * h + 2 * h * f + 9 * h + f
    return m.num_layers * per_layer + (m.vocab_size + m.seq_length) * h + 2 * h


def activation_elements(sc) -> int:
    """Elements every layer of every sample keeps, unsharded: sbh(34 + 5as/h)/2 bytes->elements
    (K22 §1 at 2 bytes/element, an upper bound for any t, SP and recompute), plus the logits."""
    m, p = sc.model, sc.parallel
    s, h, a = m.seq_length, m.hidden_size, m.num_attention_heads
    per_sample_layer = s * h * 17 + 5 * a * s * s // 2 + s * m.ffn * 3
    return p.global_batch * (m.num_layers * per_sample_layer + 3 * s * m.vocab_size)


def numeric_bytes(sc) -> int:
    """Bytes numeric mode allocates, an upper estimate: weights, gradients and two Adam moments on
    every replica plus the single-device reference's copy, and every activation of the global
    batch twice (parallel run and reference), all in the numeric dtype."""
    itemsize = 4 if sc.run.numeric_dtype == "float32" else 8
    params = param_count(sc.model) * 4 * (sc.parallel.data_parallel_size + 1)
    return itemsize * (params + 2 * activation_elements(sc))


def numeric_seconds(sc) -> float:
    """CPU seconds of one numeric iteration: 8 FLOPs per parameter per token (forward 2, backward
    4, recompute 2; N21 Eq. 3) plus attention's 16s^2h per layer and sample, at
    NUMERIC_FLOPS_PER_SECOND, plus the per-op overhead of every rank's layer-steps."""
    m, p = sc.model, sc.parallel
    tokens = p.global_batch * m.seq_length
    attention = 16 * m.num_layers * p.global_batch * m.seq_length ** 2 * m.hidden_size
    flops = 8 * param_count(m) * tokens + attention
    overhead = (layer_steps(sc) + 2 * mtp_steps(sc)) * p.world_size * \
        NUMERIC_SECONDS_PER_LAYER_STEP
    return flops / NUMERIC_FLOPS_PER_SECOND + overhead


class VerdictCounts(NamedTuple):
    """What the shortcut verdict leaves one meta iteration, counted before it runs
    (shortcuts/work_counts.py run_seconds); the defaults are the rule's before any verdict."""

    # False: the check steps the FSDP rings whole (units that do not cut into equal node
    # pieces), priced per d²
    fsdp_pieces: bool = True
    flows: int = 0  # the stepped rings' flows (work_counts.py estimated_counts)
    # the FSDP rings' (stepped whole, as pieces, arithmetic steps, arithmetic collectives),
    # replacing the d² and per-piece rules
    fsdp_flows: tuple[int, ...] | None = None
    a2a: tuple[int, int] | None = None  # (alone all-to-alls' flows, the check's members)
    ep_pairs: float | None = None  # flows one stepped all-to-all starts where not ep²
    exchange_flows: int = 0  # TE's ring exchanges' flows (shortcuts/overlap_counts.py)
    flow_visits: float = 0.0  # flows the fair-share solves take up (work_counts.py ep_visits)
    gather_flows: float = 0.0  # the token-count all-gathers' flows
    # the DP replicas whose stages the representative runs (FSDP: per placement and kind of
    # shard, shortcuts/representative.py fsdp_replicas; CP: per placement, cp_replicas)
    replicas: int = 1
    cp_lone: bool = False  # the CP p2p rings alone on their links (lone_ring.py): cheaper sends
    cp_templates: bool = False  # layer templates split at the CP calls (model/replay.py)
    ranks: int | None = None  # the ranks the run simulates (work_counts.py run_ranks)
    cp_shadows: bool = False  # CP rank 0 of each stage runs for its group (shadows.py)
    cp_members: int = 0  # the CP groups' members the check lists as all-to-alls


def meta_seconds(sc, representative: bool, counts: VerdictCounts = VerdictCounts()) -> float:
    """CPU seconds of one meta iteration: layer-steps x the measured cost per step (which grows
    with d), or x every rank of a stage (t*d, each TP ring step costing more with t) without
    the representative shortcut; plus each simulated rank's schedule steps (chunk_steps: a
    model chunk's forward or backward of one micro-batch, with its pipeline transfer), its plan
    (every layer's parameter names: ranks x L) and its data-parallel gradient buckets; plus
    the FSDP rings (fsdp_seconds), the pair terms (pair_seconds) and each counted flow at its
    price (`counts`: VerdictCounts). Context parallelism runs every rank but where its
    representative holds (cp_representative: TP rank 0's cp ranks per stage), else t*cp*d
    ranks per stage; with shadows the leader's layer-steps and schedule steps once, the
    group's vectors per CP rank."""
    c = counts
    p = sc.parallel
    cp_ranks = cp_representative(sc, representative)
    representative = representative and p.cp == 1
    shadows = c.cp_shadows and cp_ranks
    per_step = layer_step_seconds(sc, representative, cp_ranks, c.replicas, c.cp_lone,
                                  c.cp_templates)
    if shadows:
        per_step = c.replicas * (CP_SHADOW_SECONDS_PER_LEADER_STEP
                                 + p.cp * CP_SHADOW_SECONDS_PER_RANK_STEP)
    ranks = c.ranks
    if ranks is None:
        ranks = simulated_ranks(sc, representative or cp_ranks) * (
            c.replicas if representative or cp_ranks else 1)
    plans = ranks * sc.model.num_layers * PLAN_SECONDS_PER_RANK_LAYER
    running = ranks / p.cp if shadows else ranks  # those with a program
    steps = chunk_steps(sc) * running / p.pp * META_SECONDS_PER_CHUNK_STEP  # each one's
    buckets = ranks * bucket_count(sc) * SECONDS_PER_BUCKET if p.dp > 1 else 0.0
    fsdp = fsdp_seconds(sc, c.fsdp_pieces, c.fsdp_flows, representative or cp_ranks)
    mtp = mtp_steps(sc) * MTP_SECONDS_PER_DEPTH_STEP * (1 if representative else p.tp * p.dp)
    return (RUN_START_SECONDS + layer_steps(sc) * per_step + steps + plans + buckets + fsdp + mtp
            + pair_seconds(sc, c.a2a, cp_ranks, c.ep_pairs, c.cp_lone, c.replicas, shadows)
            + c.flows * SECONDS_PER_FLOW + c.cp_members * CP_CHECK_SECONDS_PER_MEMBER
            + c.exchange_flows * EXCHANGE_SECONDS_PER_FLOW
            + c.flow_visits * SECONDS_PER_FLOW_VISIT + c.gather_flows * SECONDS_PER_GATHER_FLOW)


def layer_step_seconds(sc, representative: bool, cp_ranks: bool, replicas: int,
                       cp_lone: bool, cp_templates: bool = False) -> float:
    """CPU seconds of one layer-step (meta_seconds): the representative's (growing with d, once
    per replica it runs), TP rank 0's cp ranks' (replayed around their CP calls where
    templates are used, a lone p2p ring's cheaper), or every rank's."""
    p = sc.parallel
    if representative:
        return replicas * (META_SECONDS_PER_LAYER_STEP
                           + p.dp * META_SECONDS_PER_LAYER_STEP_PER_REPLICA)
    lone = cp_lone and p.cp_comm_type == "p2p"
    if cp_ranks and cp_templates and lone:  # split templates around a lone ring's pass: the
        # constant's fit (cp-lone); other CP calls keep the price below (cp-allgather measured
        # the same with and without templates, work_constants.py)
        return replicas * p.cp * CP_TEMPLATE_SECONDS_PER_RANK_STEP
    if cp_ranks:  # the cp ranks of TP rank 0 run in each replica kept
        return replicas * p.cp * (CP_SECONDS_PER_RANK_STEP if lone else
                                  FULL_SECONDS_PER_RANK_STEP + p.tp * FULL_SECONDS_PER_RING_RANK)
    return p.tp * p.cp * p.dp * (FULL_SECONDS_PER_RANK_STEP + p.tp * FULL_SECONDS_PER_RING_RANK)


def cp_representative(sc, representative: bool) -> bool:
    """Whether a context-parallel run may keep only TP rank 0's cp ranks per stage, in one
    replica per placement on the leaves (shortcuts/representative.py: no experts, no FSDP, t
    dividing the GPUs per node, replicas of t·c ranks on whole nodes or on blocks of rails of
    whole-node stages; the check's link conditions and the replicas it keeps are known only to
    the verdict, so this is the estimate's optimistic side, as the representative is without
    CP)."""
    p, per_node = sc.parallel, sc.cluster.gpus_per_node
    replica = p.tp * p.cp
    tiles = p.dp == 1 or replica % per_node == 0 or (
        per_node % replica == 0 and p.dp * replica % per_node == 0)
    return (representative and p.cp > 1 and tiles and sc.model.num_experts is None
            and p.fsdp is None and per_node % p.tp == 0)


def fsdp_seconds(sc, fsdp_pieces: bool, fsdp_flows: tuple[int, ...] | None,
                 representative: bool = False) -> float:
    """CPU seconds of the FSDP rings (as meta_seconds takes its arguments): their counted
    flows (stepped whole, as pieces) and the steps and collectives run in arithmetic (pieces
    of one member per node) where given; else (no verdict yet) with the representative, where
    every ring holds one member per node (t >= GPUs per node: a DP x CP group is every t-th
    rank), the cheapest the verdict can make them, each stage's collectives in arithmetic
    (n − 1 lockstep steps each: shortcuts/work_counts.py train_steps); else one node's pieces
    where every unit splits so, else the whole rings' d² rule."""
    p = sc.parallel
    d, per_node = p.dp * p.cp, sc.cluster.gpus_per_node
    if fsdp_flows is not None:
        stepped, pieces, steps, collectives = (*fsdp_flows, 0, 0)[:4]
        return (stepped * FSDP_SECONDS_PER_FLOW + pieces * PIECE_SECONDS_PER_FLOW
                + steps * TRAIN_SECONDS_PER_STEP + collectives * TRAIN_SECONDS_PER_COLLECTIVE)
    if representative and fsdp_pieces and p.tp >= per_node:
        return p.pp * fsdp_collectives(sc) * (TRAIN_SECONDS_PER_COLLECTIVE
                                              + (d - 1) * TRAIN_SECONDS_PER_STEP)
    if fsdp_pieces and p.tp * p.cp * p.pp == 1 and d > per_node and d % per_node == 0:
        return fsdp_collectives(sc) * d * per_node * FSDP_SECONDS_PER_COLLECTIVE_PIECE
    return p.pp * fsdp_collectives(sc) * d ** 2 * FSDP_SECONDS_PER_COLLECTIVE_D2


def pair_seconds(sc, a2a: tuple[int, int] | None = None, cp_ranks: bool = False,
                 ep_pairs: float | None = None, cp_lone: bool = False,
                 replicas: int = 1, cp_shadows: bool = False) -> float:
    """The terms that grow with the square of a group: every pair of a CP group's ranks
    exchanges K/V blocks (p2p ring, a2a), every pair of EP ranks tokens (MoE dispatch).
    `a2a`: (alone all-to-all flows, checked members) where the verdict counted them: the
    check's members priced (its listing grows with the members, no longer their pairs), and
    the all-to-alls timed alone by their flows in place of the per-pair rule. `cp_ranks`: one
    CP group per stage and replica kept (`replicas`) runs (cp_representative); `cp_lone` its
    p2p ring alone on its links too (meta_seconds), each call then worked out in arithmetic
    (context_parallel/ring_pass.py) unless SMs are shared. `ep_pairs`: the flows
    one all-to-all starts where the run does not start one per pair (under rail symmetry one
    per orbit of its pairs: shortcuts/work_counts.py), in place of ep². `cp_shadows`: the
    ring's pairs of each call priced with the group's vectors (meta_seconds); here once per
    run, each CP index's charges of its c steps (shared by the stages: shadows.py)."""
    p, m = sc.parallel, sc.model
    alone_flows, members = (0, 0) if a2a is None else a2a
    seconds = members * CHECK_SECONDS_PER_MEMBER
    groups = replicas if cp_ranks else p.tp * p.dp  # CP groups per stage that run
    if cp_shadows:
        seconds += groups * p.cp ** 2 * CP_SHADOW_SECONDS_PER_RANK_PAIR
    if p.cp > 1 and p.cp_comm_type != "allgather" and not cp_shadows:
        per_pair = CP_SECONDS_PER_RANK_PAIR
        if cp_ranks and cp_lone:  # ring_pass.py works the calls out where no SM is shared
            per_pair = CP_LONE_SECONDS_PER_RANK_PAIR if sms_shared(sc) else \
                CP_PASS_SECONDS_PER_RANK_PAIR
        seconds += layer_steps(sc) * groups * p.cp ** 2 * per_pair
    ep = p.expert_model_parallel_size
    if alone_flows:
        seconds += alone_flows * A2A_ALONE_SECONDS_PER_FLOW
    elif m.num_experts is not None and ep > 1:
        moe_share = sum(map(m.is_moe_layer, range(m.num_layers))) / m.num_layers
        ep_flows = ep ** 2 if ep_pairs is None else ep_pairs
        per_step = ep_flows * EP_SECONDS_PER_RANK_PAIR.get(p.moe_token_dispatcher_type,
                                                     EP_SECONDS_PER_RANK_PAIR["alltoall"])
        if p.moe_token_dispatcher_type == "alltoall":
            per_step += ep_flows ** 2 * EP_SECONDS_PER_RANK_PAIR_SQUARED
        seconds += _ep_exchanges(sc) * moe_share * per_step
    return seconds


def _ep_exchanges(sc) -> float:
    """MoE layer-steps whose all-to-alls run as flows: every one, except where nothing can
    meet them (balanced routing, ETP 1, no overlapped DP traffic): then each is timed alone
    once per placement and byte matrix or DeepEP plan (engine/exchanges.py), about once per
    stage."""
    p, m = sc.parallel, sc.model
    alone = (p.moe_token_dispatcher_type in ("alltoall", "flex") and m.moe_routing_imbalance == 0
             and p.etp == 1 and not (p.overlap_grad_reduce or p.overlap_param_gather)
             and not sends_beside_compute(sc))
    return min(layer_steps(sc), p.pp) if alone else layer_steps(sc)


def sends_beside_compute(sc) -> bool:
    """Pipeline sends are non-blocking and may cross a NIC while an all-to-all does
    (shortcuts/clashes.py): the split-backward schedules' (training/pipeline/schedules.py
    SPLIT_BACKWARD) and --overlap-p2p-communication's, with p > 1."""
    p = sc.parallel
    return p.pp > 1 and (p.schedule_name in SPLIT_BACKWARD_SCHEDULES
                         or p.overlap_p2p_communication)


def fsdp_collectives(sc, layers: int | None = None) -> int:
    """FSDP collectives of one stage of `layers` layers (default L / p) per iteration
    (training/data_parallel/fsdp.py): two gathers and a reduce-scatter per layer and
    micro-batch with sharded parameters, a reduce-scatter with sharded gradients, else one
    reduction per layer (and one gather after the step)."""
    p = sc.parallel
    if p.fsdp is None or p.dp * p.cp == 1:
        return 0
    layers = sc.model.num_layers // p.pp if layers is None else layers
    m = p.num_micro_batches
    if p.fsdp in ("fsdp2", "optim_grads_params"):
        return 3 * layers * m
    return layers * m if p.fsdp == "optim_grads" else 2 * layers


def simulated_ranks(sc, representative: bool) -> int:
    """Ranks the simulation runs a program for: one per stage with the shortcut (with context
    parallelism TP rank 0's cp ranks, where cp_representative), else all."""
    p = sc.parallel
    if representative and p.cp > 1:
        return p.cp * p.pp if cp_representative(sc, True) else p.world_size
    return p.pp if representative else p.world_size


def bucket_count(sc) -> int:
    """Gradient buckets of one stage's rank (Megatron DDP, training/data_parallel/grad_buckets.py):
    its tensors (TP shards: 12 per layer, the embedding and final norm) filled in order into
    buckets that close once they hold the bucket size."""
    p, m = sc.parallel, sc.model
    h = m.hidden_size
    tensors = layer_tensors(sc) * (m.num_layers // p.pp) + [m.vocab_size * h // p.tp, h, h]
    return buckets_of(tensors, bucket_size(p.dp, p.overlap_grad_reduce, p.ddp_bucket_size))


def layer_tensors(sc) -> list[int]:
    """One layer's gradient tensors on a TP rank, in module order (elements each, shape (12,)):
    QKV, projection, fc1, fc2 (weight, bias), two norms (weight, bias)."""
    m, t = sc.model, sc.parallel.tp
    h, f = m.hidden_size, m.ffn
    return [3 * h * h // t, 3 * h // t, h * h // t, h, h * f // t, f // t, f * h // t, h,
            h, h, h, h]


def buckets_of(tensors: list[int], size: int | None) -> int:
    """Buckets `tensors` (elements each, in the order they fill) make when a bucket closes once
    it holds `size` elements (None: one bucket)."""
    if size is None:
        return 1
    count, held = 0, 0
    for numel in tensors:
        held += numel
        if held >= size:
            count, held = count + 1, 0
    return max(1, count + (held > 0))


def meta_bytes(sc, representative: bool = True, ranks: int | None = None,
               templates: bool | None = None, detail: DetailSpans | None = None,
               records: int = 0, cp_shadows: bool = False) -> int:
    """Bytes meta mode keeps: the ledger and trace per layer-step of every simulated rank of a
    stage, and every simulated rank's plan (its list of every layer's parameter names: ranks x L).
    `ranks`: the ranks the run simulates (shortcuts/work_counts.py run_ranks: the plan's, its
    replicas and expert groups counted), else simulated_ranks' rule. `templates`: whether the
    verdict replays layer templates (else as the representative: templates need it); a rank
    that runs its layers untemplated keeps far more per layer-step (full_bytes). `detail`: the
    spans of `--trace full` (DetailSpans; None below it); `records`: the data-parallel rings'
    transfer records the network keeps (shortcuts/record_counts.py dp_ring_records);
    `cp_shadows`: only CP rank 0 of each CP group runs its layer-steps
    (training/context_parallel/shadows.py)."""
    ranks = simulated_ranks(sc, representative) if ranks is None else ranks
    templates = representative if templates is None else templates
    running = ranks // sc.parallel.cp if cp_shadows else ranks  # those with a program
    # the layer-steps of every simulated rank of a stage, each rank its own ledger and trace
    rank_steps = (layer_steps(sc) + mtp_steps(sc)) * running // sc.parallel.pp
    plans = ranks * sc.model.num_layers * PLAN_BYTES_PER_RANK_LAYER
    spans = detail_bytes(sc, detail, templates, rank_steps, ranks)
    if not templates:
        return full_bytes(sc, rank_steps, ranks, records) + plans + spans
    return rank_steps * META_BYTES_PER_LAYER_STEP + plans + spans


def _check_memory(need: int, field: str, what: str, hint: str = "") -> None:
    """One error giving the estimated bytes and the limit when `need` is above it."""
    if need > MEMORY_LIMIT_BYTES:
        raise UserError(field, f"{what} {format_bytes(need)} of memory, above the limit of "
                               f"{format_bytes(MEMORY_LIMIT_BYTES)}{hint}")


class MetaWork(NamedTuple):
    """What a shortcut verdict leaves a meta iteration, counted before it runs
    (training/driver/work_verdict.py verdict_work); the defaults are the rules' alone."""

    seconds: float | None = None  # CPU s (shortcuts/work_counts.py run_seconds), else
    # meta_seconds' rule
    ranks: int | None = None  # the ranks it simulates (work_counts.py run_ranks), else
    # simulated_ranks' rule
    templates: bool | None = None  # whether it replays layer templates (meta_bytes)
    detail: DetailSpans | None = None  # the spans of `--trace full` (None below it)
    records: int = 0  # the data-parallel rings' transfer records (record_counts.py)
    shadows: bool = False  # whether its CP groups run as one program (meta_bytes)


def check_work(sc, iterations: int = 1, shortcuts: bool = True, force: bool = False,
               worst_case: str = "", meta: MetaWork = MetaWork()) -> None:
    """Refuse work beyond the limits with one error giving the estimate and the limit:
    memory (numeric mode) always, time unless `force`. `iterations` counts whole simulated
    iterations, at most that many where `worst_case` accounts for them (verify: two per checked
    tensor, four more per tensor re-differenced, commands/verify.py _iterations); `meta`: what
    the shortcut verdict leaves a meta iteration (MetaWork)."""
    if sc.run.mode == "numeric":
        _check_memory(numeric_bytes(sc), "run.mode", "numeric mode would allocate about",
                      " (use --mode meta)")
        seconds = numeric_seconds(sc) * iterations
    else:
        _check_memory(meta_bytes(sc, shortcuts, meta.ranks, meta.templates, meta.detail,
                                 meta.records, meta.shadows), "work",
                      "meta mode would keep about")
        seconds = (meta_seconds(sc, shortcuts) if meta.seconds is None
                   else meta.seconds) * iterations
    if seconds > TIME_LIMIT_S and not force:
        count = f"up to {iterations} iterations: {worst_case}" if worst_case else \
            f"{iterations} iteration(s)"
        raise UserError("work", f"{'up to ' if worst_case else ''}about {seconds:.3g} CPU "
                        f"seconds to simulate ({layer_steps(sc)} layer-steps x {count}), above "
                        f"the limit of {TIME_LIMIT_S:g} s (--force to run anyway)")
