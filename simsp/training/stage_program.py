"""One stage's iteration as Megatron-LM runs it: compute steps and the p2p calls between them.

The call sequence comes from training/p2p_program.py, the calls from training/p2p.py; without
--overlap-p2p-communication each call blocks the stage, with it a call is waited for just before
the next compute of its direction (Megatron's wait_handles). Without SP, p2p tensors are
scattered over the TP ranks and all-gathered on arrival (Megatron's scatter/gather, default on).
"""

import math

from simsp.model import mappings
from simsp.model.tensor import FP16
from simsp.training import p2p
from simsp.training.grad_buckets import GradSync
from simsp.training.p2p_program import Exchange, call_name_of_kinds, megatron_program
from simsp.training.plan import StagePlan
from simsp.training.schedules import interleaved_warmup, one_f_one_b_warmup
from simsp.training.steps import RankState, activation_shape, backward_step, forward_step


KIND_OF_KEY = {"act": "F", "grad": "B"}  # p2p key kind -> the kind of step that sends it


def run_schedule(r, run, plan: StagePlan, state: RankState):
    """The stage's steps with Megatron's p2p calls between them (training/p2p_program.py)."""
    state.grad_sync = GradSync(r, run, plan, state.grads)
    state.grad_sync.start_param_gather(r, run)
    program = megatron_program(list(plan.steps), run.sc.parallel.schedule_name,
                               _warmup(run, plan), run.sc.parallel.overlap_p2p_communication)
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
    name = call_name_of_kinds(frozenset(KIND_OF_KEY[op.key[0]] for op in sends),
                              frozenset(KIND_OF_KEY[op.key[0]] for op in recvs))
    return p2p.post(r, run.mailbox, run.world.network, name, sends, recvs)


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
    shape = activation_shape(run, r)
    if _scatter_gather(run, r):
        shape = (math.prod(shape) // r.tp.size,)
    name = "recv_activation" if kind == "act" else "recv_gradient"
    r.scope = f"mb{step.micro_batch}.c{step.chunk}."
    buffer = r.alloc(shape, FP16, name, category="communication")
    return p2p.RecvOp((kind, step.micro_batch, k, plan.tp, plan.dp), buffer)


def _gather_chunk(r, run, chunk):
    """All-gather the received 1/t chunks over the TP group (NVLink) into the full tensor."""
    start = r.env.now
    shape = activation_shape(run, r)
    full = yield from mappings.run_collective(r, "all_gather", chunk, shape, shape,
                                              "p2p_gather", label="all_gather_pp",
                                              track="pp_comm", blocking=False)
    r.count_exposed("pp_transfer", r.env.now - start)
    r.free(chunk)
    return full
