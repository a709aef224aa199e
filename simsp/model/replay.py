"""Layer templates: record a layer's forward or backward once, replay it for every later layer.

Used only in meta mode with one simulated rank per TP group and whole-collective timing: there a
layer step's duration and its ledger traffic cannot depend on the step (no waiting on other
ranks, no link contention), so replaying the recording is exact; tests/test_shortcuts.py shows
it gives the same iteration time and ledgers as executing every op.

With context parallelism a layer step waits on its CP group inside the attention core (the
rank's `r.cp` calls), so its template is split there (SplitTemplate, one per simulated rank):
the segments before, between and after the CP calls are replayed, the CP calls themselves run
for real on tensors rebuilt from their recorded shapes; tests/test_cp_templates.py.
"""

from collections.abc import MutableMapping
from dataclasses import dataclass
import math

from simsp.engine.memory import CATEGORIES, INPUT, OpBlock, expand
from simsp.model.tensor import Tensor
SKIPPED_TRACKS = ("pp_comm", "dp_comm")  # other processes of the rank; never part of a layer


@dataclass(frozen=True)
class TensorShape:
    key: str | None  # relative to the scope, or INPUT; None: kept outside the ledger
    shape: tuple
    itemsize: int
    kept: object = None  # a ledger-less tensor itself (e.g. MoE's routing counts), reused as is


@dataclass(frozen=True)
class Template:
    """What one layer step did on its rank, relative to its start time and key scope."""

    duration_s: float
    block: OpBlock  # the step's ledger changes, applied as one record
    counters: tuple  # (name of Rank dict, ((key, delta), ...))
    spans: tuple  # (track, name, start offset, end offset, args)
    result: object  # TensorShape, or (TensorShape, {name: TensorShape})


class DirectLayers:
    """Run every layer op for real (numeric mode, or the full simulation)."""

    def run(self, r, kind: tuple, x: Tensor, body):
        """`body()`: the layer's own generator."""
        return body()

    def settle_counters(self, ranks: dict) -> None:
        """Nothing replayed, nothing to add."""

    def has_template(self, kind: tuple) -> bool:
        """Never: every layer runs."""
        return False


@dataclass(frozen=True)
class Segment:
    """The ops of a split layer step between two CP calls, relative to the segment's start."""

    duration_s: float
    block: OpBlock
    spans: tuple


@dataclass(frozen=True)
class CpCall:
    """One call of the rank's CP attention (`r.cp.forward` or `.backward`) in a layer step."""

    method: str
    phase: str  # the rank's phase at the call (recompute inside a recomputed core)
    args: tuple  # after r: TensorShape for a tensor argument, else the argument itself


@dataclass(frozen=True)
class SplitTemplate:
    """A layer step around its CP calls: Segment, CpCall, Segment, ..., Segment."""

    pieces: tuple
    counters: tuple  # the segments' counter changes, summed (the calls count for real)
    result: object  # as Template.result


class LayerTemplates:
    """Record the first layer step of each kind, replay it afterwards."""

    def __init__(self):
        self.templates: dict[tuple, Template] = {}
        self.split: dict[tuple, SplitTemplate] = {}  # (rank, kind) -> its CP-split template
        self.replays: dict[tuple, int] = {}  # (rank, kind) -> replays whose counters are owed

    def run(self, r, kind: tuple, x: Tensor, body):
        """A generator that replays the template of `kind`, or runs `body()` (a layer
        forward/backward generator) and records it."""
        if r.cp is not None:  # split at the CP calls, one template per rank
            owed = (r.rank, kind)
            split = self.split.get(owed)
            if split is None:
                return self._record_split(r, owed, x, body)
            self.replays[owed] = self.replays.get(owed, 0) + 1
            return _replay_split(r, split, x)
        template = self.templates.get(kind)
        if template is not None:
            owed = (r.rank, kind)
            self.replays[owed] = self.replays.get(owed, 0) + 1
            return _replay(r, template, x)
        return self._record(r, kind, x, body)

    def settle_counters(self, ranks: dict) -> None:
        """Add every replay's counter changes (FLOPs, bytes, busy and exposed seconds) to its
        rank, n replays as n times the change: nothing reads them during the simulation."""
        for (rank, kind), count in sorted(self.replays.items()):
            template = self.split.get((rank, kind)) or self.templates[kind]
            for name, changes in template.counters:
                counter = getattr(ranks[rank], name)
                for key, delta in changes:
                    counter[key] = counter.get(key, 0) + delta * count
        self.replays.clear()

    def has_template(self, kind: tuple) -> bool:
        """Whether a layer step of this kind would be replayed whole (a split one never
        chains: its CP calls run)."""
        return kind in self.templates

    def replay_chain(self, r, kind: tuple, x: Tensor, scopes: list[str]):
        """A generator replaying the template of `kind` once per scope, back to back, each
        layer's input the previous one's output; returns every layer's result."""
        owed = (r.rank, kind)
        self.replays[owed] = self.replays.get(owed, 0) + len(scopes)
        return _replay_chain(r, self.templates[kind], x, scopes)

    def _record(self, r, kind: tuple, x: Tensor, body):
        """Run `body()` and keep what it did as the template of `kind`."""
        start = _Snapshot(r, x)
        result = yield from body()
        self.templates[kind] = start.template(r, result)
        return result

    def _record_split(self, r, owed: tuple, x: Tensor, body):
        """Run `body()` with r's CP attention tapped (_CpTap) and keep what it did, split at
        the CP calls, as the template of (rank, kind); none where the tap found the step
        unlike a replay (a CP call outside the layer's scope)."""
        tap = _CpTap(r, x)
        r.cp = tap
        try:
            result = yield from body()
        finally:
            r.cp = tap.real
        split = tap.template(r, result)
        if split is not None:
            self.split[owed] = split
        return result


_COUNTERS = ("flops", "comm_bytes", "busy_s", "exposed_s", "moe_load", "tp_overlap_s")


class _Snapshot:
    """The rank's state at the start of a recorded layer step (or of a segment of one)."""

    def __init__(self, r, x: Tensor, scope: str | None = None):
        self.t0, self.input_key = r.env.now, x.key
        self.scope = r.scope if scope is None else scope
        self.n_records = len(r.ledger.records)
        self.n_spans = len(r.trace.spans) if r.trace is not None else 0
        self.counters = {name: dict(getattr(r, name)) for name in _COUNTERS}

    def relative(self, key: str) -> str | None:
        if key == self.input_key:
            return INPUT
        return key[len(self.scope):] if key.startswith(self.scope) else None

    def template(self, r, result) -> Template:
        segment = self.segment(r)
        counters = tuple((name, changes) for name in _COUNTERS
                         if (changes := self._changes(name, getattr(r, name))))
        return Template(segment.duration_s, segment.block, counters, segment.spans,
                        self._shape(result))

    def segment(self, r) -> Segment:
        """What the rank did since the snapshot: time, ledger changes (of keys in the scope
        or the input's), spans merged per track."""
        ops = tuple((e.time_s - self.t0, e.delta_bytes, rel, e.category, e.op)
                    for e in expand(r.ledger.records[self.n_records:])
                    if (rel := self.relative(e.key)) is not None)
        spans = ()
        if r.trace is not None:
            spans = _merge_by_track([s for s in r.trace.spans[self.n_spans:]
                                     if s.rank == r.rank and s.track not in SKIPPED_TRACKS],
                                    self.t0)
        return Segment(r.env.now - self.t0, OpBlock(ops, CATEGORIES), spans)

    def _changes(self, name: str, counter: dict) -> tuple:
        """(key, delta) of each entry of a Rank counter dict that moved during the step."""
        before = self.counters[name]
        return tuple((key, value - before.get(key, 0)) for key, value in counter.items()
                     if value != before.get(key, 0))

    def _shape(self, result):
        if isinstance(result, tuple):
            out, saved = result
            return (self._one(out), {name: self._one(t) for name, t in saved.items()})
        return self._one(result)

    def _one(self, t: Tensor) -> TensorShape:
        if t.key is None:  # not in the ledger: every alike layer step keeps the same one
            return TensorShape(None, t.shape, t.itemsize, kept=t)
        return TensorShape(self.relative(t.key) or t.key, t.shape, t.itemsize)


class _CpTap:
    """Stands for r.cp while a layer step is recorded: each forward or backward call closes
    the segment before it and runs the real call; everything else is the real attention's."""

    def __init__(self, r, x: Tensor):
        self.real, self.x, self.scope = r.cp, x, r.scope
        self.start = self.since = _Snapshot(r, x)
        self.pieces, self.counters, self.alike = [], {}, True

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def forward(self, r, *args):
        """The real forward, recorded as a CpCall."""
        return self._call(r, "forward", args)

    def backward(self, r, *args):
        """The real backward, recorded as a CpCall."""
        return self._call(r, "backward", args)

    def _call(self, r, method: str, args: tuple):
        self._close(r)
        self.alike &= r.scope == self.scope
        self.pieces.append(CpCall(method, r.phase, tuple(
            self.start._one(a) if isinstance(a, Tensor) else a for a in args)))
        result = yield from getattr(self.real, method)(r, *args)
        self.since = _Snapshot(r, self.x, self.scope)
        return result

    def _close(self, r) -> None:
        """End the segment running since the last snapshot; add its counter changes."""
        self.pieces.append(self.since.segment(r))
        for name in _COUNTERS:
            total = self.counters.setdefault(name, {})
            for key, delta in self.since._changes(name, getattr(r, name)):
                total[key] = total.get(key, 0) + delta

    def template(self, r, result) -> SplitTemplate | None:
        """The recorded step; None unless every CP call ran in the layer's scope."""
        self._close(r)
        if not self.alike or r.scope != self.scope:
            return None
        counters = tuple((name, tuple(changes.items()))
                         for name, changes in self.counters.items() if changes)
        return SplitTemplate(tuple(self.pieces), counters, self.start._shape(result))


def _merge_by_track(spans: list, t0: float) -> tuple:
    """One span per track covering the step's spans on it (a paper-scale trace stays small)."""
    merged = {}
    for s in spans:
        start, end, count, busy = merged.get(s.track, (s.start_s, s.end_s, 0, 0.0))
        merged[s.track] = (min(start, s.start_s), max(end, s.end_s), count + 1,
                           busy + s.end_s - s.start_s)
    return tuple((track, "layer step", start - t0, end - t0,
                  {"spans": count, "busy_s": busy})
                 for track, (start, end, count, busy) in merged.items())


def _replay(r, tpl: Template, x: Tensor):
    """Apply a template's ledger traffic and spans at this step's time and scope (its counters
    are settled at the end: LayerTemplates.settle_counters)."""
    t0, scope, input_key = r.env.now, r.scope, x.key
    _apply(r, tpl, t0, scope, input_key)
    yield r.env.timeout(tpl.duration_s)
    return _rebuild(tpl.result, scope, input_key)


def _replay_split(r, tpl: SplitTemplate, x: Tensor):
    """A split template's segments as _replay applies a template, its CP calls run for real
    in the rank's phase and this step's scope on meta tensors of the recorded shapes."""
    scope, input_key = r.scope, x.key
    label = f"{scope}{'forward' if isinstance(tpl.result, tuple) else 'backward'}"
    for piece in tpl.pieces:
        if isinstance(piece, CpCall):
            args = tuple(_meta(a, scope, input_key) if isinstance(a, TensorShape) else a
                         for a in piece.args)
            phase, r.phase = r.phase, piece.phase
            yield from getattr(r.cp, piece.method)(r, *args)
            r.phase, r.scope = phase, scope
            continue
        r.ledger.apply_block(piece.block, r.env.now, scope, input_key)
        if r.trace is not None:
            for track, _name, start, end, args in piece.spans:
                r.trace.add_span(r.rank, track, label, r.env.now + start, r.env.now + end, args)
        if piece.duration_s:  # no timeout where the recorded segment took none
            yield r.env.timeout(piece.duration_s)
    return _rebuild(tpl.result, scope, input_key)


def _replay_chain(r, tpl: Template, x: Tensor, scopes: list[str]):
    """Layer after layer as _replay does, at the very times it would (each start the previous
    start plus the duration, as the clock adds them), under one timeout for the whole chain."""
    t, results = r.env.now, []
    for scope in scopes:
        r.scope = scope
        _apply(r, tpl, t, scope, x.key)
        result = _rebuild(tpl.result, scope, x.key)
        x = result[0] if isinstance(result, tuple) else result
        results.append(result)
        t = t + tpl.duration_s
    delay = delay_to(r.env.now, t)
    if delay is not None:
        timeout = r.env.timeout(delay)
        timeout.parts = (tpl.duration_s,) * len(scopes)  # the durations it adds up, in turn
        yield timeout  # (training/pipeline/step_replay.py replays a step by its parts)
    else:  # no single delay lands exactly there: one timeout per layer, as unchained
        for _ in scopes:
            yield r.env.timeout(tpl.duration_s)
    return results


def delay_to(now: float, target: float) -> float | None:
    """The delay d with now + d == target exactly in floating point (target >= now), so one
    timeout ends where a chain of shorter ones would; None where rounding skips target (now
    half an ulp off target's grid, ties rounding to even)."""
    delay = target - now
    for _ in range(4):  # the difference is within an ulp or two of the right delay
        if now + delay < target:
            delay = math.nextafter(delay, math.inf)
        elif now + delay > target:
            delay = math.nextafter(delay, -math.inf)
        else:
            return delay
    return None


def _apply(r, tpl: Template, t0: float, scope: str, input_key: str) -> None:
    """A template's ledger changes and spans, as of t0 under `scope`."""
    r.ledger.apply_block(tpl.block, t0, scope, input_key)
    if r.trace is not None and tpl.spans:
        label = f"{scope}{'forward' if isinstance(tpl.result, tuple) else 'backward'}"
        for track, _name, start, end, args in tpl.spans:
            r.trace.add_span(r.rank, track, label, t0 + start, t0 + end, args)


def _rebuild(result, scope: str, input_key: str):
    """Meta tensors standing for the template's results, keyed in this step's scope.

    A forward's saved tensors are made only if something reads them: a replayed backward
    never does, so most are never built."""
    if isinstance(result, tuple):
        out, saved = result
        return _meta(out, scope, input_key), LazySaved(saved, scope, input_key)
    return _meta(result, scope, input_key)


def _meta(shape: TensorShape, scope: str, input_key: str) -> Tensor:
    """The meta tensor of one template result, keyed in this step's scope."""
    if shape.kept is not None:
        return shape.kept
    key = input_key if shape.key == INPUT else scope + shape.key
    return Tensor.meta(shape.shape, shape.itemsize, key)


class LazySaved(MutableMapping):
    """A forward's saved tensors {name: Tensor}, built on first use."""

    __slots__ = ("_shapes", "_scope", "_input_key", "_tensors")

    def __init__(self, shapes: dict, scope: str, input_key: str):
        self._shapes, self._scope, self._input_key = shapes, scope, input_key
        self._tensors = None

    def _built(self) -> dict:
        if self._tensors is None:
            self._tensors = {name: _meta(s, self._scope, self._input_key)
                             for name, s in self._shapes.items()}
        return self._tensors

    def __getitem__(self, name):
        return self._built()[name]

    def __setitem__(self, name, tensor):
        self._built()[name] = tensor

    def __delitem__(self, name):
        del self._built()[name]

    def __iter__(self):
        return iter(self._built())

    def __len__(self):
        return len(self._built())
