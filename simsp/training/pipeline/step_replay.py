"""Step replays of the DP replicas the representative run keeps beside replica 0 (one per
placement on the leaves, shortcuts/representative.py placement_replicas): each of their ranks
runs the first forward and backward of every model chunk, and replays the rest.

Where the plan allows it (shortcuts/plan.py step_replay_why_not: layer templates, blocking p2p,
no overlapped DP communication, no FSDP, CP, experts, MTP, FP8 amax or offload), a schedule
step is a pure delay: its layers replay their templates, its TP collectives are timed whole,
nothing else runs on the rank meanwhile, and it does the same work in every micro-batch. So a
later step of the same kind and chunk takes the same time from its start and sends a tensor of
the same shape; only the p2p calls between steps (real, through the mailbox and the network)
carry what differs between placements: their routes' latencies. Replica 0's ranks, whose
ledgers, traces and step rows the reports show, run every step; a replayed rank's ledger is
partial (its memory rows are replica 0's, metrics/memory.py ledger_of) and it is not traced.
docs/shortcuts.md, "Replicas' steps replayed".
"""

from dataclasses import dataclass

from simsp.model.tensor import Tensor
from simsp.training.pipeline.steps import _pass_on, backward_step, forward_step

COUNTERS = ("flops", "comm_bytes", "busy_s", "exposed_s", "tp_overlap_s")
REAL_STEPS = {"F": forward_step, "B": backward_step}


@dataclass(frozen=True)
class StepRecord:
    """What the first step of a (kind, chunk) did on its rank, relative to its start."""

    duration_s: float  # from the step's start to its end
    begin_s: float  # its recorded busy interval's start (after an embedding or a loss)
    sent: tuple | None  # (shape, itemsize) of the tensor it passes on, None on an end stage
    loss: object  # what a last stage's forward put in results.losses (None in meta mode)
    counters: tuple  # (name of Rank dict, ((key, delta), ...))
    owed: tuple  # ((rank, layer kind), replays): its layers' template replays (model/replay.py),
    # whose counters LayerTemplates adds after the run


class StepReplays:
    """The replayed ranks' first steps per (rank, kind, chunk), and how often each replayed."""

    def __init__(self, ranks: frozenset):
        self.ranks = ranks
        self.records: dict[tuple, StepRecord] = {}  # (rank, kind, chunk) -> its first step
        self.real: set[tuple] = set()  # (rank, mb, chunk) whose forward ran (its stash kept)
        self.replays: dict[tuple, int] = {}  # (rank, kind, chunk) -> replays, counters owed

    def work_of(self, rank: int, work: dict) -> dict:
        """The rank's step functions: `work` (stage_program.py WORK_OF_KIND) unless replayed."""
        if rank not in self.ranks:
            return work
        return {kind: self._step_of(kind) for kind in REAL_STEPS}

    def will_replay(self, rank: int, step) -> bool:
        """Whether the rank's `step` (a schedule Step) will replay, known already: its
        record exists and, for a backward, its forward replayed (else it may still run)."""
        return (record_key(rank, step.kind, step.chunk) in self.records
                and (rank, step.micro_batch, step.chunk) not in self.real)

    def _step_of(self, kind: str):
        def step(r, inputs, plan, state, results, mb: int, chunk: int):
            return self.step(kind, (r, inputs, plan, state, results), mb, chunk)
        return step

    def step(self, kind: str, args: tuple, mb: int, chunk: int):
        """A generator: the step run and recorded (the first forward of its chunk and that
        micro-batch's backward), else replayed."""
        r = args[0]
        record = self.records.get(record_key(r.rank, kind, chunk))
        if kind == "F" and record is None:
            self.real.add((r.rank, mb, chunk))
        if (r.rank, mb, chunk) in self.real:
            return self._record(kind, args, mb, chunk)
        if record is None:
            raise RuntimeError(f"rank {r.rank}: {kind} {mb}.{chunk} before its chunk's first "
                               f"{kind} ran (step replays need backwards in forward order)")
        owed = (r.rank, kind, chunk)
        self.replays[owed] = self.replays.get(owed, 0) + 1
        return _replay(kind, args, mb, chunk, record)

    def _record(self, kind: str, args: tuple, mb: int, chunk: int):
        """Run the step for real and keep it as its (kind, chunk)'s record."""
        r, inputs, plan, state, results = args
        start = r.env.now
        before = {name: dict(getattr(r, name)) for name in COUNTERS}
        layers = getattr(inputs.layers, "replays", {})
        owed_before = {key: n for key, n in layers.items() if key[0] == r.rank}
        yield from REAL_STEPS[kind](*args, mb, chunk)
        key = _sent_key(kind, plan, mb, chunk)
        sent = state.outbox.get(key) if key is not None else None
        changes = tuple((name, delta) for name in COUNTERS
                        if (delta := _changes(before[name], getattr(r, name))))
        self.records.setdefault(record_key(r.rank, kind, chunk), StepRecord(
            r.env.now - start, results.steps[r.rank][-1][3] - start,
            None if sent is None else (sent[1].shape, sent[1].itemsize),
            results.losses.get((plan.dp, mb, plan.cp)) if kind == "F" else None, changes,
            tuple((key, n - owed_before.get(key, 0)) for key, n in layers.items()
                  if key[0] == r.rank and n != owed_before.get(key, 0))))

    def settle_counters(self, ranks: dict) -> None:
        """Add every replay's counter changes (FLOPs, bytes, busy and exposed seconds) to its
        rank, n replays as n times its record's (metrics/flops.py sums every simulated rank)."""
        for (rank, kind, chunk), count in sorted(self.replays.items()):
            for name, changes in self.records[record_key(rank, kind, chunk)].counters:
                counter = getattr(ranks[rank], name)
                for key, delta in changes:
                    counter[key] = counter.get(key, 0) + delta * count
        self.replays.clear()


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
    start = r.env.now
    yield r.env.timeout(record.duration_s)
    key = _sent_key(kind, plan, mb, chunk)
    if record.sent is not None:
        _pass_on(plan, state, key, Tensor.meta(*record.sent, None))
    elif forward and plan.is_last(chunk):
        results.losses[(plan.dp, mb, plan.cp)] = record.loss
    results.record_step(r, kind, mb, chunk, start + record.begin_s)


def _sent_key(kind: str, plan, mb: int, chunk: int) -> tuple:
    """The p2p key of what the step passes on (its peer's input)."""
    k = plan.virtual_stage(chunk)
    return (("act", mb, k + 1) if kind == "F" else ("grad", mb, k - 1)) + (
        plan.tp, plan.dp, plan.cp)


def _changes(before: dict, after: dict) -> tuple:
    """(key, delta) of each entry of a Rank counter dict that moved during the step."""
    return tuple((key, value - before.get(key, 0)) for key, value in after.items()
                 if value != before.get(key, 0))
