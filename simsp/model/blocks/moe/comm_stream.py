"""Two micro-batches on one rank's compute and communication streams, as Megatron-Core's
combined 1F1B step runs them (--overlap-moe-expert-parallel-comm; docs/moe.md).

NVIDIA/Megatron-LM commit d98e8a6, megatron/core/models/common/model_chunk_schedule_plan.py
`TransformerLayerSchedulePlan.run`: only the MoE dispatch and combine (the all-to-alls) are
nodes on the communication stream; everything else of both micro-batches is on the compute
stream, and each micro-batch's nodes wait for its previous one (its CUDA event). Here each
micro-batch's step is a simpy process that holds the compute stream (a FIFO resource of one)
while it computes, and hands it over for each all-to-all, which it runs on the communication
stream (a second FIFO resource); the other micro-batch computes meanwhile. With the backward
started first, the streams take the pieces in Megatron's issue order

    comm:    combine_bwd      | dispatch_fwd -> dispatch_bwd | combine_fwd
    compute: pre_dispatch_fwd | mlp_bwd -> mlp_fwd            | pre_dispatch_bwd

(training/pipeline/ep_overlap.py times that pair from its pieces; tests/test_combined_1f1b.py
checks the two agree). The rank's key scope and phase belong to the process running, so each
is restored when its process resumes.

With --delay-wgrad-compute the backward's weight-gradient GEMMs wait in `delayed`
(training/pipeline/delay_wgrad.py) and run as Megatron's `backward_dw` nodes: at the
backward's next all-to-all they are the compute stream's next piece while that all-to-all runs on
the communication stream (`TransformerLayerSchedulePlan.run`: `mlp.backward_dw()` is issued
just before `moe_dispatch.backward`, whose event was recorded at the experts' input
gradients; a layer's `pre_dispatch_computation.backward_dw()` just before the next layer's
`moe_combine.backward`), in a pair or alone.

A DualPipe F&B pair (`beside_weights`; deepseek-ai/DualPipe dualpipe/dualpipe.py
`_forward_backward_chunk`, DeepSeek-V3 report arXiv:2412.19437 Figure 4) runs the same way, with
two additions: the backward's weight-gradient GEMMs that its B deferred so far (its `weights`,
base/wgrad_store.py) run on the compute stream while its next collective runs on the
communication stream (Figure 4's MLP(W) beside DISPATCH(B), ATTN(W) beside the next layer's
COMBINE(B)); and TP collectives go on the communication stream too (`on_comm(tp=True)`), so a
dense model's pair overlaps its TP communication. training/pipeline/ep_overlap.py
`dualpipe_pair_seconds` times that pair from its pieces (tests/test_dualpipe_pair_run.py checks
the two agree).
"""
import simpy


class PairedStreams:
    """One rank's compute and communication streams shared by a combined step's two
    micro-batches; outside such a step (`paired` False) nothing is handed over."""

    def __init__(self, env: simpy.Environment, beside_weights: bool = False):
        """Both streams free, no step running, nothing held yet; `beside_weights`: a DualPipe
        pair's streams (deferred weight gradients beside each collective, TP on comm too)."""
        self.env = env
        self.beside_weights = beside_weights
        self._weights: dict = {}  # simpy process -> () -> its deferred WeightGradStore or None
        self.compute = simpy.Resource(env, capacity=1)
        self.comm = simpy.Resource(env, capacity=1)
        self.paired = False
        self.delayed = None  # the running backward's delayed weight gradients, or None
        self._held: dict = {}  # simpy process -> its request of the compute stream
        self._held_s = 0.0  # seconds the compute stream was held, up to _since
        self._since: float | None = None  # when the current holder took it, if held

    def own(self, body, weights=None):
        """A process body: `body` (one micro-batch's step) holding the compute stream except
        while its collectives run; returns its value. `weights`: () -> the WeightGradStore its
        backward defers into now, or None (a DualPipe pair's backward)."""
        yield from self._take()
        self._weights[self.env.active_process] = weights
        result = yield from body
        self._weights.pop(self.env.active_process)
        self._give()
        return result

    def on_comm(self, r, body, key: str = "ep_comm", tp: bool = False):
        """Run `body` (an all-to-all; a TP collective if `tp`) on the communication stream, the
        compute stream handed to the other micro-batch meanwhile (after the caller's deferred
        weight gradients, in a DualPipe pair); its seconds under some compute are taken off the
        rank's exposed `key`. Under --delay-wgrad-compute an all-to-all of the backward whose
        weight gradients wait runs beside them (_beside_weight_grads), paired or not. Plain
        `yield from body` outside a pair, from a process not holding the compute stream (a
        collective inside another), or for TP outside DualPipe."""
        delayed = None if tp else self._delayed_of_caller()
        if delayed is not None:
            return (yield from self._beside_weight_grads(r, body, delayed))
        if not self.paired or self.env.active_process not in self._held or \
                (tp and not self.beside_weights):
            return (yield from body)
        scope, phase = r.scope, r.phase
        store = (self._weights.get(self.env.active_process) or _none)()
        if store is not None and store.work:  # Figure 4: W on compute beside the collective
            comm = self.env.process(self._comm(r, body, scope, phase, key))
            yield from store.run_pending(r)
            self._give()
            result = yield comm
        else:
            self._give()
            result = yield from self._comm(r, body, scope, phase, key)
        yield from self._take()
        r.scope, r.phase = scope, phase
        return result

    def _comm(self, r, body, scope: str, phase: str, key: str):
        """`body` on the communication stream (FIFO) in the caller's scope; its seconds under
        the compute stream's work come off the exposed `key`."""
        with self.comm.request() as slot:
            yield slot
            start, held = self.env.now, self.held_s()
            result = yield from _in_scope(r, body, scope, phase)
            hidden = self.held_s() - held
        exposed = r.exposed_s.get(key, 0.0)
        r.exposed_s[key] = max(0.0, exposed - min(hidden, self.env.now - start))
        return result

    def _delayed_of_caller(self):
        """The delayed weight gradients waiting to run, if the caller is their backward."""
        delayed = self.delayed
        if delayed is None or not delayed.waiting() or \
                delayed.owner is not self.env.active_process:
            return None
        return delayed

    def _beside_weight_grads(self, r, body, delayed):
        """The all-to-all `body` on the communication stream while the caller, holding the
        compute stream, runs its delayed weight gradients; then the compute stream to the other
        micro-batch (if paired) until the all-to-all ends. Its seconds under compute are taken
        off the rank's exposed EP communication."""
        scope, phase = r.scope, r.phase
        if not self.paired:  # alone: the weight gradients are the compute stream's only work
            yield from self._take()
        comm = self.env.process(self._comm(r, body, scope, phase, "ep_comm"))
        yield from delayed.run(r)
        r.scope, r.phase = scope, phase
        self._give()
        result = yield comm
        if self.paired:
            yield from self._take()
        r.scope, r.phase = scope, phase
        return result

    def held_s(self) -> float:
        """Seconds the compute stream has been held so far."""
        return self._held_s + (self.env.now - self._since if self._since is not None else 0.0)

    def _take(self):
        """Wait for the compute stream (FIFO), then hold it."""
        request = self.compute.request()
        yield request
        self._held[self.env.active_process] = request
        self._since = self.env.now

    def _give(self) -> None:
        """Hand the compute stream to the next in line."""
        self._held_s += self.env.now - self._since
        self._since = None
        self.compute.release(self._held.pop(self.env.active_process))


def _none():
    """No deferred weight gradients."""
    return None


def _in_scope(r, body, scope: str, phase: str):
    """Drive `body` with the rank's scope and phase its own at each of its resumptions (the
    other micro-batch's process sets them between), restoring the other's after each."""
    value = None
    while True:
        other = (r.scope, r.phase)
        r.scope, r.phase = scope, phase
        try:
            event = body.send(value)
        except StopIteration as stop:
            r.scope, r.phase = other
            return stop.value
        scope, phase = r.scope, r.phase
        r.scope, r.phase = other
        value = yield event
