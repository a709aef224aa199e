"""Vector clocks over a simulation's c slices (docs/context-parallel.md, "A CP group as one
program"): the ranks of CP index r on every stage form slice r, and the simulation runs slice 0
alone while every event carries the time each slice would reach it at, (c,) floats.

A delay moves every slice by the same float operation the slice's own run makes (clock +
delay, elementwise: IEEE addition per element, so each element is the float its own run
computes); a process waiting on an event resumes in each slice at the later of its own time and
the event's (max, exact); an AllOf at its events' latest. Element 0 is always the simulation's
own clock (checked where a vector is set from outside: `landed`). What is not a delay from the
current time (a time worked out per slice: a ring pass's ends, a transfer's delivery, a step's
kernels added in turn) sets its event's vector itself (`at`).
"""

from heapq import heappop, heappush

import numpy as np
from simpy.core import EmptySchedule
from simpy.events import NORMAL, AllOf, Process

ULPS_OFF = 1e-12  # relative: what a transfer's delivery may differ by from its arithmetic


class SlicesRefused(Exception):
    """A slice's time could not be followed (a transfer met another on a link): the run is
    to be made again with every rank its own program."""


class SliceClocks:
    """The (c,) clock of the running event and each event's vector, on one simpy env."""

    def __init__(self, env, c: int):
        """Install on `env`: its schedule, step and process go through the vectors."""
        self.env, self.c = env, c
        self.now = np.zeros(c)  # (c,) each slice's time at the running callback
        env.schedule, env.step = self.schedule, self.step
        env.process = lambda generator: SliceProcess(env, generator, self)

    def schedule(self, event, priority=NORMAL, delay=0) -> None:
        """Environment.schedule, the event's vector the current one plus `delay`."""
        env = self.env
        heappush(env._queue, (env._now + delay, priority, next(env._eid), event))
        fixed = event.__dict__.get("_fixed")  # (c,) set before it was scheduled, or None
        event._v = self.now + delay if fixed is None else fixed  # (c,)

    def at(self, event, vector) -> None:
        """Set a scheduled event's (c,) vector (a time worked out per slice), checked when it
        is processed."""
        event._v = event._fixed = vector

    def fix(self, event, vector) -> None:
        """Give an event not yet scheduled its (c,) vector (checked when it is processed)."""
        event._fixed = vector

    def landed(self, vector) -> None:
        """Make `vector` the current clock, its slice 0 checked against the simulation's."""
        if vector[0] != self.env._now:
            raise AssertionError(f"slice clock {vector[0]!r} off the simulation's "
                                 f"{self.env._now!r}")
        self.now = vector

    def step(self) -> None:
        """Environment.step with the popped event's vector current for its callbacks."""
        env = self.env
        try:
            env._now, _, _, event = heappop(env._queue)
        except IndexError:
            raise EmptySchedule from None
        vector = event._v
        if "_fixed" in event.__dict__ and vector[0] != env._now:
            vector = self._own(vector, event)
        if isinstance(event, AllOf) and event._events:  # every event in: their latest
            vector = np.maximum.reduce([e._v for e in event._events])
            event._v = vector
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            self.now = vector
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc

    def _own(self, vector, event):
        """`vector` with slice 0 the simulation's own time, where they differ by the network's
        rounding (engine/network.py times a flow's wake-up from its last rate solve: an ulp
        or two); a larger gap is a bug."""
        now = self.env._now
        if abs(vector[0] - now) > ULPS_OFF * abs(now):
            raise SlicesRefused(f"slice clock {vector[0]!r} off the simulation's {now!r}")
        vector = vector.copy()  # (c,)
        vector[0] = now
        event._v = vector
        return vector


class SliceProcess(Process):
    """A simpy Process whose resumption takes, per slice, the later of its own time at the
    yield and the event's (events already processed included)."""

    def __init__(self, env, generator, clocks: SliceClocks):
        self._clocks = clocks
        self._vy = clocks.now  # (c,) the process's clock when it last yielded
        super().__init__(env, generator)

    def _resume(self, event) -> None:
        """Process._resume (simpy 4.1) with the slices' clocks."""
        clocks = self._clocks
        clocks.now = np.maximum(self._vy, event._v)
        self.env._active_proc = self
        while True:
            try:
                if event._ok:
                    event = self._generator.send(event._value)
                else:
                    event._defused = True
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    event = self._generator.throw(exc)
            except StopIteration as e:
                event = None
                self._ok, self._value = True, e.args[0] if len(e.args) else None
                self.env.schedule(self)
                break
            except BaseException as e:
                event = None
                self._ok = False
                e.__traceback__ = e.__traceback__.tb_next
                self._value = e
                self.env.schedule(self)
                break
            if event.callbacks is not None:
                event.callbacks.append(self._resume)
                break
            clocks.now = np.maximum(clocks.now, event._v)  # processed already: its vector
        self._vy = clocks.now
        self._target = event
        self.env._active_proc = None
