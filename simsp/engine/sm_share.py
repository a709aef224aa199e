"""SM contention: a rank's compute kernel slowed by the SMs its communication kernels hold.

A communication kernel that runs beside compute on the same GPU holds some of its streaming
multiprocessors for as long as it runs: an NCCL collective one thread block per channel
(NVIDIA/nccl src/enqueue.cc ncclLaunchKernel: grid = {nChannels, 1, 1}, one block per
channel), a Transformer Engine userbuffers kernel its configured SMs. The compute kernel then
runs at (SMs − taken) / SMs of its rate while they overlap; the communication kernel is not
slowed (its time is set by the links). `take` / `give_back` say when SMs are held on a rank
(any caller: the communicator's collectives, or another kernel holding a fixed SM count);
`run` is one compute kernel of given full-rate seconds, re-timed whenever its rank's taken
SMs change, as the fair share re-times flows when a link's load changes (docs/tp-overlap.md#sm-contention).
"""

import simpy


class SmShare:
    """The SMs communication kernels hold on each rank, and compute kernels timed around them."""

    def __init__(self, env: simpy.Environment, sm_count: int):
        self.env = env
        self.sm_count = sm_count  # SMs of one GPU (the GPU profile's [attention] sm_count)
        self.taken: dict[int, int] = {}  # rank -> SMs its running communication kernels hold
        self.slowed_s: dict[int, float] = {}  # rank -> compute seconds added by contention
        self._changed: dict[int, simpy.Event] = {}  # rank -> fired when its taken SMs change

    def take(self, rank: int, sms: int) -> None:
        """A communication kernel starts on `rank` holding `sms` SMs."""
        self._set(rank, self.taken.get(rank, 0) + sms)

    def give_back(self, rank: int, sms: int) -> None:
        """A communication kernel holding `sms` SMs ends on `rank`."""
        self._set(rank, self.taken[rank] - sms)

    def rate(self, rank: int) -> float:
        """The fraction of its full rate a compute kernel on `rank` runs at now."""
        taken = min(self.taken.get(rank, 0), self.sm_count)
        return (self.sm_count - taken) / self.sm_count

    def run(self, rank: int, seconds: float):
        """One compute kernel of `seconds` at full rate on `rank`: its remaining work re-timed
        at each change of the rank's taken SMs (use with `yield from`)."""
        start, remaining = self.env.now, seconds  # remaining: full-rate seconds of work left
        while remaining > 0:
            rate, changed, since = self.rate(rank), self._event(rank), self.env.now
            if rate == 0:  # every SM held: the kernel waits for one to come back
                yield changed
                continue
            done = self.env.timeout(remaining / rate)
            yield done | changed
            if done.processed:
                break
            remaining -= (self.env.now - since) * rate
        added = self.env.now - start - seconds
        if added > 0:
            self.slowed_s[rank] = self.slowed_s.get(rank, 0.0) + added

    def margin_rate(self, reserved: int) -> float:
        """The fraction of its full rate a GEMM launched on all SMs but `reserved` keeps
        throughout (Transformer Engine's set_sm_margin: the GEMM's SM budget is cut at launch,
        transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp CommOverlapCore
        `_math_sms = set_sm_margin ? sm_count - num_comm_sm : sm_count`)."""
        return (self.sm_count - reserved) / self.sm_count

    def _event(self, rank: int) -> simpy.Event:
        """The event fired at the next change of `rank`'s taken SMs."""
        event = self._changed.get(rank)
        if event is None or event.triggered:
            event = self._changed[rank] = self.env.event()
        return event

    def _set(self, rank: int, sms: int) -> None:
        self.taken[rank] = sms
        event = self._changed.pop(rank, None)
        if event is not None and not event.triggered:
            event.succeed()
