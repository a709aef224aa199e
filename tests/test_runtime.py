"""Megatron's runtime, pinned on hand-worked tiny timelines: blocking combined p2p calls, the
p2p call sequence of schedules.py, DP gradient buckets and their overlap with backward."""

from types import SimpleNamespace

import pytest
import simpy

from simsp.scenario.loading import load_scenario
from simsp.engine.group_timing import RING_ALONE, EveryGroup
from simsp.engine.collectives.ring_timing import collective_time
from simsp.hardware.costmodel import kernel_time
from simsp.model.params import param_shapes
from simsp.model.tensor import FP16, FP32, Tensor
from simsp.training.driver.world import build_world
from simsp.training.pipeline import p2p
from simsp.scenario.config import bucket_size
from simsp.training.data_parallel.bucket_params import build_buckets
from simsp.training.data_parallel.grad_buckets import DDPBuckets
from simsp.training.pipeline.p2p_program import Exchange, call_name, megatron_program
from simsp.training.pipeline.plan import stage_plans
from simsp.training.pipeline.schedules import one_f_one_b, one_f_one_b_warmup


# ------------------------------------------------------------------ p2p call sequence

def calls(program) -> list[str]:
    """The program as Megatron call names and steps, empty calls dropped."""
    out = []
    for action in program:
        if isinstance(action, Exchange):
            if action.sends or action.recvs:
                out.append(call_name(list(action.sends), list(action.recvs)))
        else:
            out.append(str(action))
    return out


def test_1f1b_program_is_megatrons_call_sequence():
    """forward_backward_pipelining_without_interleaving, p = 4, m = 3, stage 1 (warm-up 2),
    written out by hand from schedules.py (first/last-stage peers not yet dropped)."""
    steps = one_f_one_b(4, 3)[1]
    program = megatron_program(steps, "1f1b", one_f_one_b_warmup(4, 3, 1))
    assert calls(program) == [
        "recv_forward", "F0", "send_forward", "recv_forward", "F1", "send_forward",
        "recv_forward",  # before the steady state
        "F2", "send_forward_recv_backward", "B0", "send_backward",  # last steady iteration
        "recv_backward", "B1", "send_backward", "recv_backward", "B2", "send_backward"]


def test_interleaved_program_combines_each_phase_with_the_next_inputs():
    """Interleaved: one call after each phase; steady phases are forward+backward pairs."""
    from simsp.training.pipeline.schedules import interleaved_one_f_one_b, interleaved_warmup
    steps = interleaved_one_f_one_b(2, 2, 2)[1]  # stage 1: warm-up 2(p-r-1)+(v-1)p = 2
    program = megatron_program(steps, "interleaved", interleaved_warmup(2, 2, 2, 1))
    assert calls(program) == [
        "recv_forward", "F0", "send_forward_recv_forward", "F1",
        "send_forward_recv_forward_backward", "F0.1", "B0.1",
        "send_forward_backward_recv_forward_backward", "F1.1", "B1.1",
        "send_forward_backward_recv_backward", "B0", "send_backward_recv_backward", "B1",
        "send_backward"]


# ------------------------------------------------------------------ blocking p2p timeline

class FixedLink:
    """Every transfer takes `seconds`, whatever else is in flight."""

    def __init__(self, env, seconds):
        self.env, self.seconds = env, seconds

    def transfer(self, src, dst, nbytes, label="", delivered=None):
        """Succeed `delivered` with (start_s, end_s) after the fixed time, as Network does."""
        start, done = self.env.now, self.env.timeout(self.seconds)
        done.callbacks.append(lambda _e: delivered.succeed((start, self.env.now)))
        return delivered


def stub_rank(env, rank):
    r = SimpleNamespace(env=env, rank=rank, numeric=False, trace=None, exposed_s={})
    r.count_exposed = lambda track, s: r.exposed_s.__setitem__(
        track, r.exposed_s.get(track, 0.0) + s) if s > 0 else None
    r.free = lambda *tensors: None
    return r


def two_stage_1f1b(forward_s, backward_s, link_s, m=2):
    """Run Megatron's 1F1B call sequence on 2 stages with fixed step and link times."""
    env = simpy.Environment()
    mailbox, link = p2p.Mailbox(env), FixedLink(env, link_s)
    ranks = [stub_rank(env, 0), stub_rank(env, 1)]
    spans, ends = {0: [], 1: []}, {}

    def ops(stage, call):
        sends = [p2p.SendOp(("act" if s.kind == "F" else "grad", s.micro_batch), 1 - stage,
                            Tensor.meta((1,), FP16, None), 1, None)
                 for s in call.sends if (s.kind == "F") == (stage == 0)]
        recvs = [p2p.RecvOp(("act" if s.kind == "F" else "grad", s.micro_batch),
                            Tensor.meta((1,), FP16, None))
                 for s in call.recvs if (s.kind == "F") == (stage == 1)]
        return sends, recvs

    def stage(i):
        steps = one_f_one_b(2, m)[i]
        for action in megatron_program(steps, "1f1b", one_f_one_b_warmup(2, m, i)):
            if isinstance(action, Exchange):
                sends, recvs = ops(i, action)
                if sends or recvs:
                    handle = p2p.post(ranks[i], mailbox, link, "call", sends, recvs)
                    yield from p2p.wait(ranks[i], handle)
            else:
                start = env.now
                yield env.timeout(forward_s if action.kind == "F" else backward_s)
                spans[i].append((str(action), start, env.now))
        ends[i] = env.now

    env.process(stage(0))
    env.process(stage(1))
    env.run()
    return spans, ends, ranks


def test_blocking_combined_p2p_on_two_stages_by_hand():
    """f = 1, b = 2, link 0.5. Stage 0: F0 0-1; send_forward blocks 1-1.5; F1 1.5-2.5;
    send_forward_recv_backward posted at 2.5 but stage 1 posts its matching calls only after
    B0 (4.5): both transfers 4.5-5; B0 5-7; recv_backward 7-8.5 (stage 1 sends at 8);
    B1 8.5-10.5. Stage 1: recv_forward 0-1.5; F0 1.5-2.5; B0 2.5-4.5;
    send_backward_recv_forward 4.5-5; F1 5-6; B1 6-8; send_backward 8-8.5."""
    spans, ends, ranks = two_stage_1f1b(1.0, 2.0, 0.5)
    assert spans[0] == [("F0", 0, 1), ("F1", 1.5, 2.5), ("B0", 5, 7), ("B1", 8.5, 10.5)]
    assert spans[1] == [("F0", 1.5, 2.5), ("B0", 2.5, 4.5), ("F1", 5, 6), ("B1", 6, 8)]
    assert ends == {0: 10.5, 1: 8.5}
    # blocked time: transfer while data moves, wait while the peer has not posted
    assert ranks[0].exposed_s == pytest.approx({"pp_transfer": 1.5, "pp_wait": 3.0})
    assert ranks[1].exposed_s == pytest.approx({"pp_transfer": 1.5, "pp_wait": 1.0})


# ------------------------------------------------------------------ gradient buckets

def test_buckets_walk_parameters_in_reverse_and_close_at_the_size():
    """param_and_grad_buffer.py: reverse order, a bucket closes once it reaches the size; the
    shared embedding (distributed optimizer) gets its own bucket; ends padded."""
    params = [("a", 5), ("b", 3), ("c", 4), ("d", 2), ("w", 6)]
    got = [(b.names, b.numel) for b in build_buckets(params, 6, shared="w")]
    assert got == [(("w",), 6), (("d", "c"), 6), (("b", "a"), 8)]
    got = [(b.names, b.numel) for b in build_buckets(params, None, pad_to=4)]
    assert got == [(("w", "d", "c", "b", "a"), 20)]
    assert bucket_size(4, True) == 40_000_000 and bucket_size(64, True) == 64_000_000
    assert bucket_size(64, False) is None and bucket_size(8, True, 1000) == 1000


def bucket_world(**parallel):
    """p = 1, t = 1, d = 2 on one node, 4 layers of h = 64 (49 984 parameters each)."""
    overrides = {("model", "num_layers"): 4, ("model", "hidden_size"): 64,
                 ("run", "mode"): "meta", ("parallel", "data_parallel_size"): 2,
                 ("parallel", "global_batch_size"): 2, ("parallel", "overlap_grad_reduce"): True,
                 ("parallel", "ddp_bucket_size"): 49_984}
    overrides.update({("parallel", k): v for k, v in parallel.items()})
    sc = load_scenario(None, overrides)
    world = build_world(sc, simulated=[0], timing_of=EveryGroup(RING_ALONE))
    plan = stage_plans(sc, world.grid)[0]
    grads = {n: Tensor.meta(shape, FP32, n) for n, shape in param_shapes(sc.model).items()}
    return sc, world, plan, grads


def scale_s(r, numel: int, average: bool = False) -> float:
    """Megatron's `grad_data *= 1/d` on a 4-byte bucket (reads and writes it), on the compute
    stream before the bucket's collective; none when the collective averages."""
    return 0.0 if average else kernel_time("elementwise", 0, 2 * 4 * numel, cal=r.compute_cal)


@pytest.mark.parametrize("average", [False, True])
def test_bucket_all_reduces_overlap_the_remaining_backward_by_hand(average):
    """Buckets (reverse order, size one layer: 49 984): final_ln and layer 3 down to its QKV
    weight; layer 3's ln1 and layer 2 down to its QKV weight; ...; layer 0's ln1 and the
    position and word embeddings. Layer backwards take 40 µs each after the head, the embedding
    backward 10 µs; a completed bucket's scaling kernel S_k (1/d, none under
    --ddp-average-in-collective) holds the compute stream, then its all-reduce starts when the
    DP stream is free (FIFO): start_k = max(ready_k, end_(k-1)), end_k = start_k + T_k."""
    sc, world, plan, grads = bucket_world(ddp_average_in_collective=average)
    r, env = world.ranks[0], world.env
    sync = DDPBuckets(r, sc.parallel, world.grid, plan, grads)
    assert [b.names[-1] for b in sync.buckets] == [
        "layers.3.attn.qkv.weight", "layers.2.attn.qkv.weight", "layers.1.attn.qkv.weight",
        "layers.0.attn.qkv.weight", "embedding.word"]  # each later bucket starts with ln1
    layer_s, embedding_s, done = 40e-6, 10e-6, []

    def program():
        yield from sync.grads_ready(r, plan, 0, 0, ["head"])
        for i in (3, 2, 1, 0):
            yield env.timeout(layer_s)
            yield from sync.grads_ready(r, plan, 0, 0, [i])
        yield env.timeout(embedding_s)
        yield from sync.grads_ready(r, plan, 0, 0, ["embedding"])
        yield from sync.finish(r)
        done.append(env.now)

    env.process(program())
    env.run()
    now, end = 0.0, 0.0
    for bucket, work_s in zip(sync.buckets, [layer_s] * 4 + [embedding_s]):
        numel = sum(grads[n].numel for n in bucket.names)
        now += work_s + scale_s(r, numel, average)  # the backward, then the scaling kernel
        end = max(now, end) + collective_time("all_reduce", world.network.graph, [0, 1],
                                              4 * numel, world.network.calibration, 4)
    assert done == [pytest.approx(end, rel=1e-12)]
    assert r.exposed_s["dp_comm"] == pytest.approx(end - now, rel=1e-9)


def test_without_overlap_one_bucket_reduces_after_the_backward():
    sc, world, plan, grads = bucket_world(overlap_grad_reduce=False,
                                          accumulate_allreduce_grads_in_fp32=False)
    r, env = world.ranks[0], world.env
    sync = DDPBuckets(r, sc.parallel, world.grid, plan, grads)
    assert len(sync.buckets) == 1
    done = []

    def program():
        for i in (3, 2, 1, 0):
            yield env.timeout(1e-3)
            yield from sync.grads_ready(r, plan, 0, 0, [i])
        yield from sync.finish(r)
        done.append(env.now)

    env.process(program())
    env.run()
    total = 2 * sum(g.numel for g in grads.values())  # 2 bytes: no fp32 accumulation
    scale = kernel_time("elementwise", 0, 2 * total, cal=r.compute_cal)  # 1/d, read + write
    expected = 4e-3 + scale + collective_time("all_reduce", world.network.graph, [0, 1], total,
                                              world.network.calibration, 2)
    assert done == [pytest.approx(expected, rel=1e-12)]


def test_overlapped_program_posts_each_direction_after_its_step():
    """--overlap-p2p-communication (interleaved): send_forward_recv_forward after a forward,
    send_backward_recv_backward after a backward; the first backward's receive is posted at
    the end of the warm-up."""
    from simsp.training.pipeline.schedules import interleaved_one_f_one_b, interleaved_warmup
    steps = interleaved_one_f_one_b(2, 2, 2)[1]  # F0 F1 | F0.1 B0.1 F1.1 B1.1 | B0 B1
    program = megatron_program(steps, "interleaved", interleaved_warmup(2, 2, 2, 1), True)
    assert calls(program) == [
        "recv_forward", "F0", "send_forward_recv_forward", "F1", "send_forward_recv_forward",
        "recv_backward", "F0.1", "send_forward_recv_forward", "B0.1",
        "send_backward_recv_backward", "F1.1", "send_forward", "B1.1",
        "send_backward_recv_backward", "B0", "send_backward_recv_backward", "B1", "send_backward"]


def test_overlapped_param_gather_chain_by_hand():
    """--overlap-param-gather: bucket all-gathers in forward order, the first issued at time 0
    (the previous step's), each waited by the first forward that uses it, which then issues the
    next (distributed_optimizer.py forward pre-hooks). Embedding 10 µs, layers 40 µs."""
    sc, world, plan, grads = bucket_world(distributed_optimizer=True, overlap_param_gather=True)
    r, env = world.ranks[0], world.env
    sync = DDPBuckets(r, sc.parallel, world.grid, plan, grads)
    b = sync.buckets  # b[4]: layer 0's ln1 + embeddings; b[3]: layer 1's ln1 + layer 0; ...

    def gather_s(bucket):
        return collective_time("all_gather", world.network.graph, [0, 1], 2 * bucket.numel,
                               world.network.calibration, 2)

    modules = [("embedding", 10e-6, b[3])] + [(i, 40e-6, nxt) for i, nxt in
                                             ((0, b[2]), (1, b[1]), (2, b[0]), (3, None))]
    done = []

    def program():
        sync.start_param_gather(r)
        for module, seconds, _ in modules:
            yield from sync.params_needed(r, 0, [module])
            yield env.timeout(seconds)
        yield from sync.params_needed(r, 0, ["head"])
        done.append(env.now)

    env.process(program())
    env.run()
    now, gathered, waited = 0.0, gather_s(b[4]), 0.0
    for _, seconds, nxt in modules:
        waited += max(gathered - now, 0.0)
        now = max(now, gathered)
        if nxt is not None:
            gathered = now + gather_s(nxt)
        now += seconds
    assert done == [pytest.approx(now, rel=1e-12)]
    assert r.exposed_s["dp_comm"] == pytest.approx(waited, rel=1e-9)


@pytest.mark.parametrize("parallel,field", [
    ({"overlap_p2p_communication": True}, "parallel.overlap_p2p_communication"),
    ({"overlap_param_gather": True, "overlap_grad_reduce": True},
     "parallel.overlap_param_gather"),
    ({"ddp_bucket_size": 0}, "parallel.ddp_bucket_size")])
def test_megatrons_own_checks_on_the_runtime_switches(parallel, field):
    from simsp.errors import UserError
    with pytest.raises(UserError) as caught:
        load_scenario(None, {("parallel", k): v for k, v in parallel.items()})
    assert caught.value.field == field
