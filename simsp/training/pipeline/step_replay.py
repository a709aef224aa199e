"""Step replays of the DP replicas the representative run keeps beside replica 0 (one per
placement on the leaves, shortcuts/representative.py placement_replicas): each of their ranks
runs the forwards and backwards of a model chunk until two runs of each agree, then replays
the rest, ending each at the very float time it would.

Where the plan allows it (shortcuts/plan.py step_replay_why_not: layer templates, blocking p2p,
no overlapped DP communication, no FSDP, CP, experts, MTP, FP8 amax or offload), a schedule
step is a pure delay: its layers replay their templates, its TP collectives are timed whole,
nothing else runs on the rank meanwhile, and it does the same work in every micro-batch. So a
later step of the same kind and chunk waits on the same timeouts and sends a tensor of the
same shape; only the p2p calls between steps (real, through the mailbox and the network)
carry what differs between placements: their routes' latencies. Replica 0's ranks, whose
ledgers, traces and step rows the reports show, run every step; a replayed rank's ledger is
partial (its memory rows are replica 0's, metrics/memory.py ledger_of) and it is not traced.
docs/shortcuts.md, "Replicas' steps replayed".
"""

from dataclasses import dataclass, replace

from simpy.events import Timeout

from simsp.model.replay import delay_to
from simsp.model.tensor import Tensor
from simsp.training.pipeline.steps import _pass_on, backward_step, forward_step

COUNTERS = ("flops", "comm_bytes", "busy_s", "exposed_s", "tp_overlap_s")
REAL_STEPS = {"F": forward_step, "B": backward_step}
# Runs of a step in a row that waited on another event than a timeout (an embedding's or a
# head's collectives) after which its (rank, kind, chunk) is no longer recorded, only run: such
# a step is never confirmed (StepReplays._record), so the recording bought nothing. Three: a
# chunk's first run may wait on its layers' first runs, before their templates (model/replay.py),
# and still confirm on the next two; a cost rule only, the times are the same either way
GIVE_UP_AFTER = 3


@dataclass(frozen=True)
class StepRecord:
    """What a step of a (kind, chunk) did on its rank, relative to its start."""

    # per timeout it waited on, in order, the delays it added up (one, or a chain of layer
    # templates' durations: model/replay.py _replay_chain; None where it waited on another
    # event: an embedding's or a head's collectives), and how many had passed at the start of
    # its busy interval (after an embedding or a loss)
    delays: tuple | None
    begin_at: int
    sent: tuple | None  # (shape, itemsize) of the tensor it passes on, None on an end stage
    loss: object  # what a last stage's forward put in results.losses (None in meta mode)
    counters: tuple  # (name of Rank dict, ((key, delta), ...))
    owed: tuple  # ((rank, layer kind), replays): its layers' template replays (model/replay.py),
    # whose counters LayerTemplates adds after the run
    confirmed: bool = False  # a second run did the same (StepReplays._record): replayable


class StepReplays:
    """The replayed ranks' step records per (rank, kind, chunk), and how often each replayed."""

    def __init__(self, ranks: frozenset):
        self.ranks = ranks
        self.records: dict[tuple, StepRecord] = {}  # (rank, kind, chunk) -> its record
        self.replayed: set[tuple] = set()  # (rank, mb, chunk) whose forward replayed, until
        # its backward does
        self.replays: dict[tuple, int] = {}  # (rank, kind, chunk) -> replays, counters owed
        self.replayed_steps = 0  # in all, kept after the counters are settled
        self.ready: set[tuple] = set()  # (rank, chunk) whose F and B records are confirmed
        self.inexact: dict[tuple, int] = {}  # (rank, kind, chunk) -> its runs in a row that
        # waited on another event (GIVE_UP_AFTER of them: run from then on, not recorded)
        self._layer_keys: dict[int, tuple] = {}  # rank -> (len of the layers' replays, the
        # rank's keys there, in their order)

    def work_of(self, rank: int, work: dict) -> dict:
        """The rank's step functions: `work` (stage_program.py WORK_OF_KIND) unless replayed."""
        if rank not in self.ranks:
            return work
        return {kind: self._step_of(kind) for kind in REAL_STEPS}

    def will_replay(self, rank: int, step) -> bool:
        """Whether the rank's `step` (a schedule Step) will replay, known already: a forward
        whose chunk's records are confirmed, a backward whose forward replayed."""
        if step.kind == "F":
            return self._confirmed(rank, step.chunk)
        return (rank, step.micro_batch, step.chunk) in self.replayed

    def _confirmed(self, rank: int, chunk: int) -> bool:
        """Both the chunk's forward and backward records are confirmed (see _record; once
        confirmed a record is never replaced, so the answer is kept)."""
        if (rank, chunk) in self.ready:
            return True
        if all((record := self.records.get(record_key(rank, kind, chunk))) is not None
               and record.confirmed for kind in REAL_STEPS):
            self.ready.add((rank, chunk))
            return True
        return False

    def _step_of(self, kind: str):
        def step(r, inputs, plan, state, results, mb: int, chunk: int):
            return self.step(kind, (r, inputs, plan, state, results), mb, chunk)
        return step

    def step(self, kind: str, args: tuple, mb: int, chunk: int):
        """A generator: the step replayed (a forward once its chunk's records are confirmed,
        a backward whose forward replayed), else run and recorded."""
        r = args[0]
        batch = (r.rank, mb, chunk)
        if kind == "F" and self._confirmed(r.rank, chunk):
            self.replayed.add(batch)
        elif kind == "F" or batch not in self.replayed:  # its forward ran: its stash is kept
            if self.inexact.get((r.rank, kind, chunk), 0) >= GIVE_UP_AFTER:
                return REAL_STEPS[kind](*args, mb, chunk)
            return self._record(kind, args, mb, chunk)
        else:
            self.replayed.discard(batch)
        count = (r.rank, kind, chunk)
        self.replays[count] = self.replays.get(count, 0) + 1
        self.replayed_steps += 1
        return _replay(kind, args, mb, chunk, self.records[record_key(r.rank, kind, chunk)])

    def _record(self, kind: str, args: tuple, mb: int, chunk: int):
        """Run the step and keep it as its (kind, chunk)'s record: confirmed once two runs
        waited on the same timeouts and passed on the same shape (the first step of a chunk
        may record a layer template or run its layers one by one, later ones chain them: the
        same time, not the same float additions); never replaced once confirmed."""
        r, inputs, plan, state, results = args
        start = r.env.now
        before = {name: dict(getattr(r, name)) for name in COUNTERS}
        layers = getattr(inputs.layers, "replays", {})
        owed_before = {key: layers[key] for key in self._keys_of(layers, r.rank)}
        delays, times = [], [start]
        yield from _timed(r.env, REAL_STEPS[kind](*args, mb, chunk), delays, times)
        key = _sent_key(kind, plan, mb, chunk)
        sent = state.outbox.get(key)
        changes = tuple((name, delta) for name in COUNTERS
                        if (delta := _changes(before[name], getattr(r, name))))
        begin = results.steps[r.rank][-1][3]
        exact = None not in delays and begin in times
        new = StepRecord(
            tuple(delays) if exact else None, times.index(begin) if exact else 0,
            None if sent is None else (sent[1].shape, sent[1].itemsize),
            results.losses.get((plan.dp, mb, plan.cp)) if kind == "F" else None, changes,
            tuple((key, layers[key] - owed_before.get(key, 0))
                  for key in self._keys_of(layers, r.rank)
                  if layers[key] != owed_before.get(key, 0)))
        count = (r.rank, kind, chunk)
        self.inexact[count] = 0 if exact else self.inexact.get(count, 0) + 1
        old = self.records.get(record_key(r.rank, kind, chunk))
        if old is None or not old.confirmed:
            self.records[record_key(r.rank, kind, chunk)] = replace(new, confirmed=_alike(
                old, new))

    def _keys_of(self, layers: dict, rank: int) -> tuple:
        """The rank's keys (rank, layer kind) among the layers' replays, in the dict's order
        (keys are only added during a run: worked out again when it grew)."""
        known = self._layer_keys.get(rank)
        if known is None or known[0] != len(layers):
            known = self._layer_keys[rank] = (len(layers),
                                              tuple(key for key in layers if key[0] == rank))
        return known[1]

    def settle_counters(self, ranks: dict) -> None:
        """Add every replay's counter changes (FLOPs, bytes, busy and exposed seconds) to its
        rank, n replays as n times its record's (metrics/flops.py sums every simulated rank)."""
        for (rank, kind, chunk), count in sorted(self.replays.items()):
            for name, changes in self.records[record_key(rank, kind, chunk)].counters:
                counter = getattr(ranks[rank], name)
                for key, delta in changes:
                    counter[key] = counter.get(key, 0) + delta * count
        self.replays.clear()


def _alike(old: StepRecord | None, new: StepRecord) -> bool:
    """Two runs of a step waited on the same timeouts, began their busy interval after the
    same ones and passed on the same shape."""
    return (old is not None and old.delays is not None and old.delays == new.delays
            and old.begin_at == new.begin_at and old.sent == new.sent)


def record_key(rank: int, kind: str, chunk: int) -> tuple:
    """The record a step replays: its own rank's first of its kind and chunk (each stage's and
    each placement's steps differ: embedding, loss, TP groups across a spine)."""
    return rank, kind, chunk


def _replay(kind: str, args: tuple, mb: int, chunk: int, record: StepRecord):
    """The step as its record: its input taken from the inbox and dropped, its time, its
    output (a ledger-less tensor of the recorded shape) passed on or its loss kept."""
    r, inputs, plan, state, results = args
    k = plan.virtual_stage(chunk)
    forward = kind == "F"
    for owed, count in record.owed:  # its layers' replays, counted as if they ran
        inputs.layers.replays[owed] = inputs.layers.replays.get(owed, 0) + count
    r.phase, r.scope = ("forward" if forward else "backward"), f"mb{mb}.c{chunk}."
    if not (plan.is_first(chunk) if forward else plan.is_last(chunk)):
        r.free(state.inbox.pop(("act" if forward else "grad", mb, k, plan.tp, plan.dp,
                                plan.cp)))
    begin = yield from _wait_delays(r.env, record.delays, record.begin_at)
    key = _sent_key(kind, plan, mb, chunk)
    if record.sent is not None:
        _pass_on(plan, state, key, Tensor.meta(*record.sent, None))
    elif forward and plan.is_last(chunk):
        results.losses[(plan.dp, mb, plan.cp)] = record.loss
    results.record_step(r, kind, mb, chunk, begin)


def _wait_delays(env, delays: tuple, begin_at: int):
    """Wait the recorded timeouts, ending at the very float time they would (each part
    added to the clock in turn, as simpy and a chain of layer templates add them: model/replay.py
    _replay_chain), in one timeout where one lands there, else part by part; returns the clock
    after the first `begin_at` timeouts."""
    start = end = env.now
    begin = start if begin_at == 0 else None
    for i, parts in enumerate(delays, 1):
        for part in parts:
            end = end + part
        if i == begin_at:
            begin = end
    delay = delay_to(start, end)
    if delay is not None:
        yield env.timeout(delay)
    else:
        for parts in delays:
            for part in parts:
                yield env.timeout(part)
    return begin


def _timed(env, steps, delays: list, times: list):
    """Run the generator `steps` as `yield from` would, noting each event it waits on: a
    timeout's delay (None for any other event) and the clock when it resumes."""
    try:
        event = next(steps)
        while True:
            delays.append(getattr(event, "parts", (event._delay,)) if type(event) is Timeout
                          else None)
            try:
                value = yield event
            except BaseException as error:  # an interrupt: passed on, as yield from does
                times.append(env.now)
                event = steps.throw(error)
                continue
            times.append(env.now)
            event = steps.send(value)
    except StopIteration as stop:
        return stop.value


def _sent_key(kind: str, plan, mb: int, chunk: int) -> tuple:
    """The p2p key of what the step passes on (its peer's input)."""
    k = plan.virtual_stage(chunk)
    return (("act", mb, k + 1) if kind == "F" else ("grad", mb, k - 1)) + (
        plan.tp, plan.dp, plan.cp)


def _changes(before: dict, after: dict) -> tuple:
    """(key, delta) of each entry of a Rank counter dict that moved during the step."""
    return tuple((key, value - before.get(key, 0)) for key, value in after.items()
                 if value != before.get(key, 0))
