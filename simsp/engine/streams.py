"""Per-device streams: a compute stream and a communication stream, like CUDA streams.

Ops on one stream run one at a time in issue order (a simpy Resource of capacity 1, FIFO);
ops on different streams of a device overlap, so communication can hide behind compute.
"""


import simpy

from simsp.engine.trace import Trace

COMPUTE, COMM = "compute", "comm"


class Stream:
    """One in-order queue of work on rank `rank`'s device; every op is recorded as a span."""

    def __init__(self, env: simpy.Environment, rank: int, track: str, trace: Trace | None = None):
        self.env = env
        self.rank = rank
        self.track = track
        self.trace = trace if trace is not None else Trace()
        self._slot = simpy.Resource(env, capacity=1)

    def run(self, name: str, duration_s: float, args: dict | None = None):
        """Occupy the stream for `duration_s` once earlier ops are done (use with `yield from`)."""
        return (yield from self.run_process(name, self._sleep(duration_s), args))

    def run_process(self, name: str, body, args: dict | None = None):
        """Hold the stream while generator `body` runs (e.g. a collective); return its value."""
        with self._slot.request() as slot:
            yield slot
            start_s = self.env.now
            result = yield from body
            self.trace.add_span(self.rank, self.track, name, start_s, self.env.now, args)
        return result

    def launch(self, name: str, body, args: dict | None = None) -> simpy.Process:
        """Issue `body` on this stream without waiting: the returned process is its handle."""
        return self.env.process(self.run_process(name, body, args))

    def _sleep(self, duration_s: float):
        """A body that only takes time."""
        yield self.env.timeout(duration_s)
