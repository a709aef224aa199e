"""One FSDP collective of a unit over the DP group, launched on its own stream, and the seconds
each unit's collectives took and the compute waited for them."""

from dataclasses import dataclass, field

import simpy

from simsp.engine.streams import Stream
from simsp.model.mappings import _bytes_sent
from simsp.model.tensor import Tensor


@dataclass
class UnitStats:
    """One unit's FSDP communication on this rank: seconds on the links and seconds the
    compute waited for it (exposed)."""

    gather_s: float = 0.0
    gather_exposed_s: float = 0.0
    reduce_s: float = 0.0
    reduce_exposed_s: float = 0.0
    gathers: int = 0
    reduces: int = 0

    def as_dict(self) -> dict:
        comm = self.gather_s + self.reduce_s
        exposed = self.gather_exposed_s + self.reduce_exposed_s
        return {"all_gather_s": self.gather_s, "all_gather_exposed_s": self.gather_exposed_s,
                "reduce_s": self.reduce_s, "reduce_exposed_s": self.reduce_exposed_s,
                "all_gathers": self.gathers, "reductions": self.reduces,
                "exposed_fraction": exposed / comm if comm else 0.0}


@dataclass
class Pending:
    """An issued collective of a unit: its process and the buffer it fills or drains."""

    process: simpy.Process
    buffer: Tensor | None = None
    start_s: float = 0.0
    result: list = field(default_factory=list)


class UnitCollectives:
    """Launching a unit's all-gather, reduce-scatter or all-reduce (mixed into fsdp.py FsdpUnits,
    whose __init__ holds the state)."""

    def _launch(self, r, stream: Stream, kind: str, unit, buffer, nbytes: int,
                elem_bytes: int) -> Pending:
        """Issue one collective of `unit` on `stream` over the DP group."""
        r.count_comm(f"{kind}_fsdp", _bytes_sent(kind, self.d, nbytes))
        pending = Pending(None, start_s=r.env.now)
        pending.process = stream.launch(f"{kind} {unit.name}",
                                        self._collective(r, kind, unit, buffer, nbytes,
                                                         elem_bytes, pending))
        return pending

    def _collective(self, r, kind, unit, buffer, nbytes, elem_bytes, pending):
        start = r.env.now
        result = yield from getattr(r.tp.comm, kind)(self.group, r.rank, buffer, nbytes,
                                                     f"fsdp {unit.name}", elem_bytes=elem_bytes)
        stats = self.stats[unit.name]
        if kind == "all_gather":
            stats.gather_s += r.env.now - start
            stats.gathers += 1
        else:
            stats.reduce_s += r.env.now - start
            stats.reduces += 1
        if r.trace is not None:
            r.trace.add_span(r.rank, "dp_comm", f"{kind} fsdp {unit.name}", start, r.env.now,
                             {"bytes": nbytes})
        pending.result.append(result)
        return result
