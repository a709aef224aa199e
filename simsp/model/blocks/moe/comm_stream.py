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
"""
import simpy


class PairedStreams:
    """One rank's compute and communication streams shared by a combined step's two
    micro-batches; outside such a step (`paired` False) nothing is handed over."""

    def __init__(self, env: simpy.Environment):
        """Both streams free, no step running, nothing held yet."""
        self.env = env
        self.compute = simpy.Resource(env, capacity=1)
        self.comm = simpy.Resource(env, capacity=1)
        self.paired = False
        self.delayed = None  # the running backward's delayed weight gradients, or None
        self._held: dict = {}  # simpy process -> its request of the compute stream
        self._held_s = 0.0  # seconds the compute stream was held, up to _since
        self._since: float | None = None  # when the current holder took it, if held

    def own(self, body):
        """A process body: `body` (one micro-batch's step) holding the compute stream except
        while its all-to-alls run; returns its value."""
        yield from self._take()
        result = yield from body
        self._give()
        return result

    def on_comm(self, r, body):
        """Run `body` (an all-to-all) on the communication stream, the compute stream handed
        to the other micro-batch meanwhile; its seconds under the other's compute are taken
        off the rank's exposed EP communication. Plain `yield from body` outside a pair."""
        delayed = self._delayed_of_caller()
        if delayed is not None:
            return (yield from self._beside_weight_grads(r, body, delayed))
        if not self.paired:
            return (yield from body)
        scope, phase = r.scope, r.phase
        self._give()
        with self.comm.request() as slot:
            yield slot
            start, held = self.env.now, self.held_s()
            result = yield from _in_scope(r, body, scope, phase)
            hidden = self.held_s() - held
        exposed = r.exposed_s.get("ep_comm", 0.0)
        r.exposed_s["ep_comm"] = max(0.0, exposed - min(hidden, self.env.now - start))
        yield from self._take()
        r.scope, r.phase = scope, phase
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
        comm = self.env.process(self._comm_piece(r, body, scope, phase))
        yield from delayed.run(r)
        r.scope, r.phase = scope, phase
        self._give()
        result, hidden = yield comm
        exposed = r.exposed_s.get("ep_comm", 0.0)
        r.exposed_s["ep_comm"] = max(0.0, exposed - hidden)
        if self.paired:
            yield from self._take()
        r.scope, r.phase = scope, phase
        return result

    def _comm_piece(self, r, body, scope: str, phase: str):
        """A process: `body` on the communication stream in the caller's scope; returns its
        value and its seconds under compute."""
        with self.comm.request() as slot:
            yield slot
            start, held = self.env.now, self.held_s()
            result = yield from _in_scope(r, body, scope, phase)
            hidden = min(self.held_s() - held, self.env.now - start)
        return result, hidden

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
