"""One schedule step on one rank: the forward or backward of a model chunk for a micro-batch.

A chunk is the embedding (first virtual stage), its layers, and the head and loss (last virtual
stage); activations and their gradients cross stages point-to-point in the calls Megatron makes
between steps (training/p2p_program.py, training/p2p.py, executed by `run_schedule`).
"""

from dataclasses import dataclass, field
import math

from simsp.model.embedding import embedding_backward, embedding_forward
from simsp.model.head import head_backward, head_forward
from simsp.model.layer import LayerSpec, layer_forward
from simsp.model import mappings
from simsp.model.layer_backward import layer_backward
from simsp.model.tensor import FP16
from simsp.training import p2p
from simsp.training.grad_buckets import GradSync
from simsp.training.p2p_program import Exchange, call_name, megatron_program
from simsp.training.plan import StagePlan, sample_offset
from simsp.training.schedule_step import Step
from simsp.training.schedules import interleaved_warmup, one_f_one_b_warmup


@dataclass
class RankState:
    """A rank's parameters (full canonical names), per-layer views, and pending stashes."""

    weights: dict
    grads: dict
    stashes: dict = field(default_factory=dict)  # (micro_batch, chunk) -> saved tensors
    inbox: dict = field(default_factory=dict)  # p2p key -> received tensor, not yet consumed
    outbox: dict = field(default_factory=dict)  # p2p key -> (destination, tensor) to send
    pending: dict = field(default_factory=dict)  # step kind -> posted p2p Handles (overlap)
    grad_sync: GradSync | None = None  # DP gradient buckets (training/grad_buckets.py)
    _layers: dict = field(default_factory=dict)  # layer index -> (weights, grads) by suffix

    def layer(self, i: int) -> tuple[dict, dict]:
        """Layer i's weights and gradients keyed by suffix ("ln1.gamma", ...)."""
        if i not in self._layers:
            prefix = f"layers.{i}."
            self._layers[i] = tuple(
                {k.removeprefix(prefix): t for k, t in table.items() if k.startswith(prefix)}
                for table in (self.weights, self.grads))
        return self._layers[i]


def _activation_shape(run, r) -> tuple:
    m, b = run.sc.model, run.sc.parallel.micro_batch_size
    s = m.seq_length // (r.tp.size if r.tp.sequence_parallel else 1)
    return (s, b, m.hidden_size)


def _micro_batch_data(run, plan: StagePlan, mb: int):
    """This replica's micro-batch of tokens and targets, (s, b) each (None in meta mode)."""
    if run.tokens is None:
        return None, None
    start = sample_offset(run.sc, plan.dp, mb)
    stop = start + run.sc.parallel.micro_batch_size
    return run.tokens[:, start:stop], run.targets[:, start:stop]


def _local_block(run, r, full, offset: int):
    """This rank's (s_l, b, h) block of a global (s, B, h) array."""
    b = run.sc.parallel.micro_batch_size
    block = full[:, offset:offset + b]  # (s, b, h)
    if r.tp.sequence_parallel:
        block = block.reshape(r.tp.size, -1, *block.shape[1:])[r.tp.index]
    return block


def forward_step(r, run, plan: StagePlan, state: RankState, mb: int, chunk: int):
    """Embedding or receive, the chunk's layers, then the loss or a send downstream."""
    sc, k = run.sc, plan.virtual_stage(chunk)
    tokens, targets = _micro_batch_data(run, plan, mb)
    offset = sample_offset(sc, plan.dp, mb)
    r.phase, r.scope = "forward", f"mb{mb}.c{chunk}."
    stash = {"layers": []}
    if plan.is_first(chunk):
        yield from state.grad_sync.params_needed(r, run, chunk, ["embedding"])
        x, stash["embedding"] = yield from embedding_forward(
            r, sc.model, state.weights, tokens, (sc.model.seq_length, sc.parallel.micro_batch_size),
            offset)
        if run.embedding_delta is not None:
            x.data = x.data + _local_block(run, r, run.embedding_delta, offset)
    else:
        x = state.inbox.pop(("act", mb, k, plan.tp, plan.dp))
    begin = r.env.now
    for i in plan.layers(chunk):
        yield from state.grad_sync.params_needed(r, run, chunk, [i])
        r.scope = f"mb{mb}.L{i}."
        spec = LayerSpec(sc.model, i, sc.parallel.recompute_granularity, offset)
        w, _ = state.layer(i)
        full = spec.recompute == "full"
        if full:
            r.save(x, "layer_input")
        out, saved = yield from run.layers.run(
            r, ("F", full), x, lambda: layer_forward(r, spec, w, x, keep=not full))
        stash["layers"].append({"layer_input": x} if full else saved)
        x = out
    r.scope = f"mb{mb}.c{chunk}."
    if plan.is_last(chunk):
        yield from state.grad_sync.params_needed(r, run, chunk, ["head"])
        loss, stash["head"] = yield from head_forward(r, sc.model, state.weights, x, targets)
        run.losses[(plan.dp, mb)] = loss
    else:
        dst = run.rank_of(plan.tp, plan.dp, (plan.pp + 1) % plan.p)
        state.outbox[("act", mb, k + 1, plan.tp, plan.dp)] = (dst, x)
    state.stashes[(mb, chunk)] = stash
    run.record_step(r, "F", mb, chunk, begin)


def backward_step(r, run, plan: StagePlan, state: RankState, mb: int, chunk: int):
    """The loss gradient or a receive, the chunk's layers backwards, then embedding or a send."""
    sc, k = run.sc, plan.virtual_stage(chunk)
    tokens, targets = _micro_batch_data(run, plan, mb)
    stash = state.stashes.pop((mb, chunk))
    r.phase, r.scope = "backward", f"mb{mb}.c{chunk}."
    if plan.is_last(chunk):
        dloss = 1.0 / (sc.model.seq_length * sc.parallel.global_batch)  # mean over B·s tokens
        dx = yield from head_backward(r, sc.model, state.weights, state.grads, targets,
                                      stash["head"], dloss)
        state.grad_sync.grads_ready(r, run, plan, chunk, mb, ["head"])
    else:
        dx = state.inbox.pop(("grad", mb, k, plan.tp, plan.dp))
    begin = r.env.now
    offset = sample_offset(sc, plan.dp, mb)
    for i, saved in zip(reversed(plan.layers(chunk)), reversed(stash["layers"])):
        r.scope = f"mb{mb}.L{i}."
        spec = LayerSpec(sc.model, i, sc.parallel.recompute_granularity, offset)
        w, g = state.layer(i)
        dx = yield from run.layers.run(
            r, ("B",), dx, lambda: layer_backward(r, spec, w, g, saved, dx))
        r.phase = "backward"
        state.grad_sync.grads_ready(r, run, plan, chunk, mb, [i])
    r.scope = f"mb{mb}.c{chunk}."
    if plan.is_first(chunk):
        if r.numeric:
            run.embedding_grads[(plan.tp, plan.dp, mb)] = dx.data.copy()  # (s_l, b, h)
        yield from embedding_backward(r, sc.model, state.weights, state.grads, tokens,
                                      stash["embedding"], dx)
        state.grad_sync.grads_ready(r, run, plan, chunk, mb, ["embedding"])
    else:
        dst = run.rank_of(plan.tp, plan.dp, (plan.pp - 1) % plan.p)
        state.outbox[("grad", mb, k - 1, plan.tp, plan.dp)] = (dst, dx)
    run.record_step(r, "B", mb, chunk, begin)


def run_schedule(r, run, plan: StagePlan, state: RankState):
    """The stage's steps with Megatron's p2p calls between them (training/p2p_program.py)."""
    state.grad_sync = GradSync.for_rank(r, run, plan, state.grads)
    state.grad_sync.start_param_gather(r, run)
    program = megatron_program(list(plan.steps), run.sc.parallel.schedule_name,
                               _warmup(run, plan))
    for action in program:
        if isinstance(action, Exchange):
            yield from _exchange(r, run, plan, state, action)
        else:
            yield from _wait_pending(r, run, state, action.kind)
            work = forward_step if action.kind == "F" else backward_step
            yield from work(r, run, plan, state, action.micro_batch, action.chunk)
    for kind in sorted(state.pending):
        yield from _wait_pending(r, run, state, kind)


def _warmup(run, plan: StagePlan) -> int:
    """Warm-up forwards of this stage (Megatron schedules.py); GPipe: every forward."""
    p, m = plan.p, run.sc.parallel.num_micro_batches
    name = run.sc.parallel.schedule_name
    if name == "interleaved":
        return interleaved_warmup(p, m, plan.v, plan.pp)
    return one_f_one_b_warmup(p, m, plan.pp) if name == "1f1b" else m


def _exchange(r, run, plan: StagePlan, state: RankState, call: Exchange):
    """Post one `_communicate` call; wait for it unless p2p overlap defers the wait."""
    sends = [op for step in call.sends if (op := _send_op(r, run, plan, state, step))]
    recvs = [op for step in call.recvs if (op := _recv_op(r, run, plan, step))]
    if not run.sc.parallel.overlap_p2p_communication:
        if sends or recvs:
            handle = _post(r, run, sends, recvs)
            yield from _receive(r, run, state, handle)
        return
    for kind, direction in (("F", "act"), ("B", "grad")):  # send_forward_recv_forward, ...
        mine = [[op for op in ops if op.key[0] == direction] for ops in (sends, recvs)]
        if mine[0] or mine[1]:
            state.pending.setdefault(kind, []).append(_post(r, run, *mine))


def _post(r, run, sends: list, recvs: list) -> p2p.Handle:
    name = call_name([_step_of(op.key) for op in sends], [_step_of(op.key) for op in recvs])
    return p2p.post(r, run.mailbox, run.world.network, name, sends, recvs)


def _step_of(key: tuple) -> Step:
    """A stand-in step whose kind names the direction of a p2p key (for call names)."""
    return Step("F" if key[0] == "act" else "B", key[1])


def _wait_pending(r, run, state: RankState, kind: str):
    """Overlap mode: wait the calls of this direction posted so far (Megatron's wait_handles)."""
    for handle in state.pending.pop(kind, []):
        yield from _receive(r, run, state, handle)


def _receive(r, run, state: RankState, handle: p2p.Handle):
    """Wait for a call; put what it received in the inbox (all-gathered if scattered)."""
    received = yield from p2p.wait(r, handle)
    for key, tensor in received.items():
        if _scatter_gather(run, r):
            tensor = yield from _gather_chunk(r, run, tensor)
        state.inbox[key] = tensor


def _scatter_gather(run, r) -> bool:
    """Megatron's scatter/gather of p2p tensors: on by default, only without SP and with t > 1."""
    p = run.sc.parallel
    return p.scatter_gather_tensors_in_pipeline and not p.sequence_parallel and r.tp.size > 1


def _send_op(r, run, plan: StagePlan, state: RankState, step) -> p2p.SendOp | None:
    """The send of a step's output (activation or input gradient), if it has a peer."""
    k = plan.virtual_stage(step.chunk)
    key = ("act", step.micro_batch, k + 1, plan.tp, plan.dp) if step.kind == "F" else \
        ("grad", step.micro_batch, k - 1, plan.tp, plan.dp)
    if key not in state.outbox:
        return None
    dst, tensor = state.outbox.pop(key)
    nbytes, payload = tensor.nbytes, tensor.data
    if _scatter_gather(run, r):  # this TP rank sends its 1/t of the replicated tensor
        nbytes //= r.tp.size
        if payload is not None:
            payload = payload.reshape(r.tp.size, -1)[r.tp.index]  # (s*b*h/t,)
    return p2p.SendOp(key, dst, tensor, nbytes, payload)


def _recv_op(r, run, plan: StagePlan, step) -> p2p.RecvOp | None:
    """The receive of a step's input, if it comes from another stage; buffer allocated now."""
    k = plan.virtual_stage(step.chunk)
    if step.kind == "F" and plan.is_first(step.chunk):
        return None
    if step.kind == "B" and plan.is_last(step.chunk):
        return None
    kind = "act" if step.kind == "F" else "grad"
    shape = _activation_shape(run, r)
    if _scatter_gather(run, r):
        shape = (math.prod(shape) // r.tp.size,)
    name = "recv_activation" if kind == "act" else "recv_gradient"
    r.scope = f"mb{step.micro_batch}.c{step.chunk}."
    buffer = r.alloc(shape, FP16, name, category="communication")
    return p2p.RecvOp((kind, step.micro_batch, k, plan.tp, plan.dp), buffer)


def _gather_chunk(r, run, chunk):
    """All-gather the received 1/t chunks over the TP group (NVLink) into the full tensor."""
    start = r.env.now
    shape = _activation_shape(run, r)
    full = yield from mappings.run_collective(r, "all_gather", chunk, shape, shape,
                                              "p2p_gather", label="all_gather_pp",
                                              track="pp_comm", blocking=False)
    r.count_exposed("pp_transfer", r.env.now - start)
    r.free(chunk)
    return full
