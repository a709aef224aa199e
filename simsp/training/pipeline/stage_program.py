"""One stage's iteration as Megatron-LM runs it: compute steps and the p2p calls between them.

The call sequence comes from training/pipeline/p2p_program.py, the calls from training/pipeline/p2p.py; without
--overlap-p2p-communication each call blocks the stage, with it a call is waited for just before
the next compute of its direction (Megatron's wait_handles). Without SP, p2p tensors are
scattered over the TP ranks and all-gathered on arrival (Megatron's scatter/gather, default on).
"""

import dataclasses
from dataclasses import dataclass
import functools
import math

from simsp.model import mappings
from simsp.model.tensor import FP16, Tensor
from simsp.training.fp8_amax import AmaxReduction
from simsp.training.pipeline import delay_wgrad, p2p
from simsp.training.data_parallel.grad_buckets import DDPBuckets
from simsp.model.blocks.moe.comm_stream import PairedStreams
from simsp.training.pipeline.combined_1f1b import combined_forwards, combined_warmup
from simsp.training.pipeline.dualpipe import defer_sends, pair_forwards, sent_after_weight
from simsp.training.pipeline.p2p_program import (
    Exchange, call_name_of_kinds, megatron_program, split_backward_program)
from simsp.training.pipeline.plan import StagePlan
from simsp.training.pipeline.schedule_step import DUAL, V_SHAPE

from simsp.training.pipeline.schedules import (
    SPLIT_BACKWARD, interleaved_warmup, one_f_one_b_warmup)
from simsp.training.pipeline.steps import (
    RankState, activation_shape, backward_step, forward_step, weight_step)


KIND_OF_KEY = {"act": "F", "grad": "B"}  # p2p key kind -> the kind of step that sends it
WORK_OF_KIND = {"F": forward_step, "B": backward_step, "W": weight_step}
BOTH_WAYS = (V_SHAPE, DUAL)  # placements whose chunks send both ways (sends waited apart)


@dataclass(frozen=True)
class P2PSetup:
    """What every p2p call of one rank shares, worked out once per iteration."""

    overlap: bool  # --overlap-p2p-communication
    scattered: bool  # Megatron's scatter/gather: each TP rank sends 1/t
    tp_size: int
    activation_shape: tuple  # (s_l, b, h) of a p2p tensor
    sends_apart: bool  # the V: a step waits only for its receive, sends at the end
    peers: dict  # {virtual stage: its rank, same tp, dp and cp} (activations go to k + 1,
    # input gradients to k - 1; in the V chunk 1 runs towards stage 0)
    mtp_stage: int | None = None  # standalone MTP: past it the tensors are 1 + D times as long
    rows_factor: int = 1  # 1 + D under standalone MTP
    # a replayed rank's StepReplays (training/pipeline/step_replay.py): the receives of steps
    # it will replay take no ledger entry; None on every other rank
    replays: object = None

    def shape_of(self, key: tuple) -> tuple:
        """The full shape of a p2p tensor: (s_l, b, h), or (s_l·(1+D), b, h) between the
        standalone MTP stage and the loss's (its concatenated hidden states, Megatron's
        MultiTokenPredictionBlock.forward, and their gradient)."""
        kind, k = key[0], key[2]
        past = self.mtp_stage is not None and (k > self.mtp_stage or (
            kind == "grad" and k == self.mtp_stage))
        if not past:
            return self.activation_shape
        rows, *rest = self.activation_shape
        return (rows * self.rows_factor, *rest)

    def received_of(self, key: tuple) -> tuple:
        """The receive buffer of `key`: its tensor, or its 1/t chunk under scatter/gather."""
        shape = self.shape_of(key)
        return (math.prod(shape) // self.tp_size,) if self.scattered else shape

    @classmethod
    def of(cls, r, sc, grid, plan: StagePlan, split: bool = False) -> "P2PSetup":
        """The rank's p2p setup from the scenario and its neighbours on the rank grid (a
        split-backward schedule's calls are always non-blocking)."""
        shape = activation_shape(sc, r)
        scattered = _scatter_gather(sc.parallel, r)
        peers = {k: grid.rank_of(plan.tp, plan.dp, plan.stage_of(k), plan.cp)
                 for k in range(plan.p * plan.v)}
        return cls(sc.parallel.overlap_p2p_communication or split, scattered, r.tp.size, shape,
                   plan.placement in BOTH_WAYS, peers, plan.mtp_stage,
                   1 + (sc.model.mtp_num_layers or 0))


def run_schedule(r, inputs, plan: StagePlan, state: RankState, results):
    """The stage's steps with Megatron's p2p calls between them
    (training/pipeline/p2p_program.py): reads the run's inputs, changes the rank's state, records
    each step into results."""
    sc, world = inputs.sc, inputs.world
    state.ddp_buckets = state.fsdp or DDPBuckets(r, sc.parallel, world.grid, plan, state.grads)
    state.ddp_buckets.start_param_gather(r)
    state.split_backward = sc.parallel.schedule_name in SPLIT_BACKWARD
    state.p2p = P2PSetup.of(r, sc, world.grid, plan, state.split_backward)
    if r.rank in inputs.replayed:
        state.p2p = dataclasses.replace(state.p2p, replays=inputs.replays)
    state.amax = AmaxReduction.of(sc, world.grid, r.rank, plan)
    triggers = _Triggers(*_chunk_triggers(state, plan), plan.placement)
    pairs = _pair_forwards(r, sc.parallel, plan)
    combined = _combined_forwards(r, sc.parallel, plan)
    program, j = _program(sc.parallel, plan, state.split_backward), 0
    work = WORK_OF_KIND if inputs.replays is None else inputs.replays.work_of(r.rank,
                                                                              WORK_OF_KIND)
    while j < len(program):
        action, j = program[j], j + 1
        if isinstance(action, Exchange):
            yield from _exchange(r, world, plan, state, action)
            continue
        if action in combined:  # Megatron's combined 1F1B step, then the calls it deferred
            j, deferred = yield from _combined_step(r, inputs, (plan, state, results),
                                                    program, j - 1, triggers)
            for call in deferred:
                yield from _exchange(r, world, plan, state, call)
            j = yield from _after_backward(r, world, plan, state, (program, j))
            yield from triggers.after(r, state, "B")
            continue
        if action in pairs:  # DualPipe's F&B pair, then the calls between its steps
            j, deferred = yield from _dualpipe_pair(r, inputs, (plan, state, results),
                                                    program, j - 1, triggers)
            for call in deferred:
                yield from _exchange(r, world, plan, state, call)
            for kind in "BW":
                yield from triggers.after(r, state, kind)
            continue
        if state.pending:
            yield from _wait_pending(r, state, action.kind)
        triggers.before(r, state, action.kind)
        yield from work[action.kind](r, inputs, plan, state, results, action.micro_batch,
                                     action.chunk)
        j = yield from _after_backward(r, world, plan, state, (program, j))
        yield from triggers.after(r, state, action.kind)
    for kind in sorted(state.pending):
        yield from _wait_pending(r, state, kind)


class _Triggers:
    """The chunk-aligned DP calls between steps: a chunk's parameter all-gather before a
    forward (aligned --overlap-param-gather), its gradient reductions after its last backward
    (W in the V and DualPipe; aligned --overlap-grad-reduce)."""

    def __init__(self, ahead: dict, reduce_after: dict, placement: str):
        """Nothing run yet."""
        self.ahead, self.reduce_after = ahead, reduce_after
        self.last_kind = "W" if placement in BOTH_WAYS else "B"
        self.forwards = self.backwards = 0

    def before(self, r, state: RankState, kind: str) -> None:
        """Before a step of `kind`: the next chunk's gather, if this forward starts it."""
        if kind == "F":
            if self.forwards in self.ahead:
                state.ddp_buckets.gather_chunk(r, self.ahead[self.forwards])
            self.forwards += 1

    def after(self, r, state: RankState, kind: str):
        """After a step of `kind`: a chunk's reductions, if this backward ends it (a
        generator: the reductions first run their gradient-scaling kernels)."""
        if kind == self.last_kind:
            if self.backwards in self.reduce_after:
                yield from state.ddp_buckets.reduce_chunk(r, self.reduce_after[self.backwards])
            self.backwards += 1


def _combined_forwards(r, parallel, plan: StagePlan) -> frozenset:
    """The forwards run combined with a backward under --overlap-moe-expert-parallel-comm
    (training/pipeline/combined_1f1b.py; the rank's streams made paired-ready), else none."""
    if not parallel.overlap_moe_expert_parallel_comm:
        return frozenset()
    r.ep_streams = PairedStreams(r.env)
    return combined_forwards(list(plan.steps), _warmup(parallel, plan))


def _pair_forwards(r, parallel, plan: StagePlan) -> frozenset:
    """The forwards of this rank's DualPipe or DualPipeV F&B pairs (training/pipeline/
    dualpipe.py; the rank's streams made pair-ready, weight gradients beside collectives),
    else none."""
    name = parallel.schedule_name
    if name not in ("dualpipe", "dualpipev"):
        return frozenset()
    r.ep_streams = PairedStreams(r.env, beside_weights=True)
    return pair_forwards(parallel.pp, parallel.num_micro_batches, plan.pp, name)


def _dualpipe_pair(r, inputs, step_state: tuple, program: list, j: int, triggers):
    """The forward at program[j] and the next B and W (its full backward) as one F&B pair
    (dualpipe.py `_forward_backward_chunk`: both inputs waited first, `_commit_and_wait_comm`),
    the backward's process first (DeepSeek-V3 Figure 4 opens with its COMBINE(B)), or, on a
    rank with no TP or EP collective to hand over at, the forward's (upstream's F then B
    without an overlap strategy); returns the index after the W and the p2p calls between,
    which run after the pair (upstream sends both outputs after it). `step_state`: (plan,
    state, results)."""
    state = step_state[1]
    k = _next_of_kind(program, j, "B")
    w = _next_of_kind(program, k, "W")
    for kind in ("F", "B"):
        yield from _wait_pending(r, state, kind)
    triggers.before(r, state, "F")
    backward = program[k]
    groups = (((program[k], program[w]),
               lambda: state.deferred.get((backward.micro_batch, backward.chunk))),
              ((program[j],), None))
    hands_over = r.tp.size > 1 or r.moe is not None and r.moe.ep * r.moe.etp > 1  # EP or ETP
    yield from _run_paired(r, inputs, step_state, groups if hands_over else groups[::-1])
    return w + 1, [call for call in program[j + 1:w] if isinstance(call, Exchange)]


def _next_of_kind(program: list, j: int, kind: str) -> int:
    """Index of the first step of `kind` after program[j]."""
    return next(i for i in range(j + 1, len(program))
                if not isinstance(program[i], Exchange) and program[i].kind == kind)


def _run_paired(r, inputs, step_state: tuple, groups: tuple):
    """Each group (steps, () -> their deferred weight gradients or None) as one process on the
    rank's paired streams (comm_stream.py), in order; the steps' spans made disjoint after."""
    plan, state, results = step_state
    streams, count = r.ep_streams, len(results.steps.get(r.rank, []))
    streams.paired = True
    results.pairing.add(r.rank)
    processes = [r.env.process(streams.own(_steps_in_order(r, inputs, step_state, steps),
                                           weights)) for steps, weights in groups]
    yield r.env.all_of(processes)
    streams.paired = False
    results.pairing.discard(r.rank)
    _serialise_spans(results.steps[r.rank], count, sum(len(steps) for steps, _ in groups))
    results.trace_steps(r, count)


def _steps_in_order(r, inputs, step_state: tuple, steps: tuple):
    """The steps one after the other, as one micro-batch's process."""
    plan, state, results = step_state
    for step in steps:
        yield from WORK_OF_KIND[step.kind](r, inputs, plan, state, results, step.micro_batch,
                                           step.chunk)


def _combined_step(r, inputs, step_state: tuple, program: list, j: int, triggers):
    """The forward at program[j] and the next backward as one combined step (comm_stream.py:
    the backward's process first, as Megatron issues its combine first), once both inputs are
    in; returns the index after the backward and the p2p calls between the two, which run
    after the step (Megatron's post_forward / post_backward). `step_state`: (plan, state,
    results)."""
    k = _next_of_kind(program, j, "B")
    state = step_state[1]
    for kind in ("F", "B"):
        yield from _wait_pending(r, state, kind)
    triggers.before(r, state, "F")
    yield from _run_paired(r, inputs, step_state, (((program[k],), None), ((program[j],), None)))
    return k + 1, program[j + 1:k]


def _after_backward(r, world, plan: StagePlan, state: RankState, at: tuple):
    """--delay-wgrad-compute: the backward's p2p call (Megatron's post_backward) if it comes
    next, then its last deferred weight gradients (training/pipeline/delay_wgrad.py); `at`:
    (program, index of the next action). Returns the index of the next action."""
    program, j = at
    if state.delayed is None:
        return j
    if j < len(program) and isinstance(program[j], Exchange):
        yield from _exchange(r, world, plan, state, program[j])
        j += 1
    yield from delay_wgrad.finish(r, state)
    return j


def _serialise_spans(spans: list, first: int, count: int) -> None:
    """The pair's `count` step spans (from index `first`) made disjoint in the order they end,
    each starting no earlier than the one before ends, so the stage's work counts the pair's
    time once (metrics/timing.py bubble)."""
    ordered = sorted(spans[first:first + count], key=lambda span: span[4])
    for i in range(1, count):
        span = ordered[i]
        ordered[i] = span[:3] + (max(span[3], ordered[i - 1][4]), span[4])
    spans[first:first + count] = ordered


def _program(parallel, plan: StagePlan, split: bool) -> list:
    """The stage's steps and p2p calls: Megatron's (training/pipeline/p2p_program.py), or the
    non-blocking calls of a split-backward schedule."""
    if split:
        program = split_backward_program(list(plan.steps))
        name = parallel.schedule_name
        if name in ("dualpipe", "dualpipev"):  # a pair's (a BW's) outputs after its W
            program = defer_sends(program, sent_after_weight(
                plan.p, parallel.num_micro_batches, plan.pp, name))
        return program
    return megatron_program(list(plan.steps), parallel.schedule_name,
                            _warmup(parallel, plan), parallel.overlap_p2p_communication)


def _chunk_triggers(state: RankState, plan: StagePlan) -> tuple[dict, dict]:
    """({forward index: model chunk whose parameters are all-gathered before it},
    {backward index: model chunk whose gradient reductions launch after it})
    (training/data_parallel/grad_buckets.py; sharded data parallelism has none)."""
    if state.fsdp is not None:
        return {}, {}
    chunks = {kind: [step.chunk for step in plan.steps if step.kind == kind] for kind in "FBW"}
    if plan.placement in BOTH_WAYS:  # each chunk's reductions after its last W (last grads)
        reduce_after = {j: chunk for chunk, j in
                        {chunk: j for j, chunk in enumerate(chunks["W"])}.items()}
        return state.ddp_buckets.chunk_ahead_triggers(chunks["F"]), \
            (reduce_after if state.ddp_buckets.align_reduce else {})
    return (state.ddp_buckets.chunk_ahead_triggers(chunks["F"]),
            state.ddp_buckets.chunk_reduce_triggers(chunks["B"]))


def _warmup(parallel, plan: StagePlan) -> int:
    """Warm-up forwards of this stage (Megatron schedules.py); GPipe: every forward; one more
    with the EP all-to-all overlap (training/pipeline/combined_1f1b.py)."""
    p, m = plan.p, parallel.num_micro_batches
    name = parallel.schedule_name
    if parallel.overlap_moe_expert_parallel_comm:
        return combined_warmup(p, m, plan.v, plan.pp)
    if name == "interleaved":
        return interleaved_warmup(p, m, plan.v, plan.pp)
    return one_f_one_b_warmup(p, m, plan.pp) if name == "1f1b" else m


def _exchange(r, world, plan: StagePlan, state: RankState, call: Exchange):
    """Post one `_communicate` call; wait for it unless p2p overlap defers the wait."""
    sends = [op for step in call.sends if (op := _send_op(r, plan, state, step))]
    recvs = [op for step in call.recvs if (op := _recv_op(r, plan, state.p2p, step))]
    if not state.p2p.overlap:
        if sends or recvs:
            received = yield from p2p.wait(r, _post(r, world, sends, recvs))
            yield from _receive(r, state, received)
        return
    if state.p2p.sends_apart:  # the V's chunks send both ways: waiting a send before the
        # next step of its kind deadlocks, so each step waits only what it receives
        if sends:
            state.pending.setdefault("sent", []).append(_post(r, world, sends, []))
        sends = []
    for kind, direction in (("F", "act"), ("B", "grad")):  # send_forward_recv_forward, ...
        mine = [[op for op in ops if op.key[0] == direction] for ops in (sends, recvs)]
        if mine[0] or mine[1]:
            state.pending.setdefault(kind, []).append(_post(r, world, *mine))


def _post(r, world, sends: list, recvs: list) -> p2p.Handle:
    """Post one call's sends and receives in the world's mailbox, over its network."""
    name = _call_name(tuple([op.key[0] for op in sends]), tuple([op.key[0] for op in recvs]))
    return p2p.post(r, world.mailbox, world.network, name, sends, recvs)


@functools.cache
def _call_name(sent: tuple, received: tuple) -> str:
    """The call's name from the kinds of the keys it sends and receives ("act", "grad"),
    worked out once per combination (no frozensets made per call)."""
    return call_name_of_kinds(frozenset(KIND_OF_KEY[kind] for kind in sent),
                              frozenset(KIND_OF_KEY[kind] for kind in received))


def _wait_pending(r, state: RankState, kind: str):
    """Overlap mode: wait the calls of this direction posted so far (Megatron's wait_handles)."""
    for handle in state.pending.pop(kind, []):
        received = yield from p2p.wait(r, handle)
        yield from _receive(r, state, received)


def _receive(r, state: RankState, received: dict):
    """Put what a finished call received ({key: tensor}) in the inbox, all-gathered if
    scattered (a generator one level below the wait, so no wake-up passes through it)."""
    if not state.p2p.scattered:
        state.inbox.update(received)
        return
    for key, tensor in received.items():
        state.inbox[key] = yield from _gather_chunk(r, state.p2p.shape_of(key), tensor)


def _scatter_gather(p, r) -> bool:
    """Megatron's scatter/gather of p2p tensors: on by default, only without SP and with t > 1."""
    return p.scatter_gather_tensors_in_pipeline and not p.sequence_parallel and r.tp.size > 1


def _send_op(r, plan: StagePlan, state: RankState, step) -> p2p.SendOp | None:
    """The send of a step's output (activation or input gradient), if it has a peer."""
    k = plan.virtual_stage(step.chunk)
    key = ("act", step.micro_batch, k + 1, plan.tp, plan.dp, plan.cp) if step.kind == "F" \
        else ("grad", step.micro_batch, k - 1, plan.tp, plan.dp, plan.cp)
    sent = state.outbox.pop(key, None)
    if sent is None:
        return None
    dst, tensor = sent
    nbytes, payload, setup = tensor.nbytes, tensor.data, state.p2p
    if setup.scattered:  # this TP rank sends its 1/t of the replicated tensor
        nbytes //= setup.tp_size
        if payload is not None:
            payload = payload.reshape(setup.tp_size, -1)[r.tp.index]  # (s*b*h/t,)
    return p2p.SendOp(key, dst, tensor, nbytes, payload)


def _recv_op(r, plan: StagePlan, setup: P2PSetup, step) -> p2p.RecvOp | None:
    """The receive of a step's input, if it comes from another stage; buffer allocated now."""
    k = plan.virtual_stage(step.chunk)
    forward = step.kind == "F"
    if plan.is_first(step.chunk) if forward else plan.is_last(step.chunk):
        return None  # the embedding makes the input / the loss makes the gradient
    if plan.stage_of(k - 1 if forward else k + 1) == plan.pp:
        return None  # the V's turn: the other chunk of this rank made it (steps.py)
    key = ("act" if forward else "grad", step.micro_batch, k, plan.tp, plan.dp, plan.cp)
    if setup.replays is not None and setup.replays.will_replay(r.rank, step):
        return p2p.RecvOp(key, Tensor.meta(setup.received_of(key), FP16, None))  # no ledger
    r.scope = f"mb{step.micro_batch}.c{step.chunk}."
    buffer = r.alloc(setup.received_of(key), FP16,
                     "recv_activation" if forward else "recv_gradient",
                     category="communication")
    return p2p.RecvOp(key, buffer)


def _gather_chunk(r, shape: tuple, chunk):
    """All-gather the received 1/t chunks over the TP group (NVLink) into the full tensor of
    `shape` (s_l, b, h)."""
    start = r.env.now
    full = yield from mappings.tensor_collective(r, "all_gather", chunk, shape, shape,
                                                 "p2p_gather", label="all_gather_pp",
                                                 track="pp_comm", blocking=False)
    r.count_exposed("pp_transfer", r.env.now - start)
    r.free(chunk)
    return full
