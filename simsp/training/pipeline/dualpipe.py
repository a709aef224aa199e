"""DualPipe and DualPipeV as op lists: the eight steps of each rank's `step()`, ported from
deepseek-ai/DualPipe at commit 3da1bbea53606543d7f5f232338fc58096db30e3 (dualpipe/dualpipe.py and
dualpipe/dualpipev.py `step`; DeepSeek-V3 technical report, arXiv:2412.19437 §3.2.1, Figure 5).

DualPipe on PP ranks (PP even, m even, m >= 2 PP): micro-batches 0..m/2-1 enter at rank 0 and run
ranks 0..PP-1 on chunk 0; m/2..m-1 enter at rank PP-1 and run ranks PP-1..0 on chunk 1 (so each
rank holds two stages: 2x parameters). Upstream numbers a rank's two chunks by "phase", phase 0
being the direction in which the rank sits in the first half (`phase ^= is_in_second_half`);
here `chunk` is the direction itself. DualPipeV ("cut-in-half", Sea AI Lab) on n ranks (m >= 2n):
every micro-batch runs chunk 0 down ranks 0..n-1 then chunk 1 back up n-1..0 (a V of 2n stages).

Both run the same eight steps with (n, h, c) = (PP/2, min(r, PP-1-r), m/2) for DualPipe and
(ranks, r, m) for DualPipeV; forwards and backwards of a chunk take its micro-batches in order,
W pops the zero-bubble backwards first in, first out (dualpipe/utils.py WeightGradStore).
"""
from collections import deque

from simsp.errors import UserError
from simsp.training.pipeline.op_step import (FORWARD, FULL_BACKWARD, INPUT_GRAD, WEIGHT_GRAD, Op,
                                             OpSchedule, Task)
from simsp.training.pipeline.schedule_step import BACKWARD, WEIGHT, Schedule, Step


class _RankOps:
    """One rank's op list being written, tracking the next micro-batch of each phase."""

    def __init__(self, chunk_of_phase: tuple[int, int], first_micro_batch: tuple[int, int]):
        """Nothing run yet; phases map to chunks and to their first global micro-batch."""
        self.chunk_of_phase = chunk_of_phase  # phase -> chunk (DualPipe: direction)
        self.first = first_micro_batch  # phase -> global id of its chunk's first micro-batch
        self.forwards, self.backwards = [0, 0], [0, 0]
        self.weights: deque = deque()  # zero-bubble backwards whose W is still to run
        self.ops: list[Op] = []

    def forward(self, phase: int) -> Task:
        """The next forward of `phase` (upstream current_f_chunk_id)."""
        task = Task(FORWARD, self.first[phase] + self.forwards[phase], self.chunk_of_phase[phase])
        self.forwards[phase] += 1
        return task

    def backward(self, phase: int, zero_bubble: bool = False) -> Task:
        """The next backward of `phase`: B with its W deferred if zero_bubble, else BW."""
        micro_batch = self.first[phase] + self.backwards[phase]
        self.backwards[phase] += 1
        chunk = self.chunk_of_phase[phase]
        if zero_bubble:
            self.weights.append((micro_batch, chunk))
            return Task(INPUT_GRAD, micro_batch, chunk)
        return Task(FULL_BACKWARD, micro_batch, chunk)

    def weight(self) -> Task:
        """W of the oldest zero-bubble backward (WeightGradStore.pop)."""
        micro_batch, chunk = self.weights.popleft()
        return Task(WEIGHT_GRAD, micro_batch, chunk)

    def run(self, *tasks: Task) -> None:
        """Append one op: a single task, or an F&B pair."""
        self.ops.append(Op(tuple(tasks)))


def _eight_steps(ops: _RankOps, n: int, h: int, c: int, is_middle: bool) -> None:
    """Upstream step() steps 1-8 (dualpipe.py; dualpipev.py the same with n ranks, rank h)."""
    for _ in range(2 * (n - h - 1)):  # step 1: nF0
        ops.run(ops.forward(0))
    for _ in range(h + 1):  # step 2: nF0F1
        ops.run(ops.forward(0))
        ops.run(ops.forward(1))
    for _ in range(n - h - 1):  # step 3: nB1W1F1, zero bubble
        ops.run(ops.backward(1, zero_bubble=True))
        ops.run(ops.weight())
        ops.run(ops.forward(1))
    _main_step(ops, c - 2 * n + h + 1, is_middle)
    for _ in range(n - h - 1):  # step 5: nB1F1B0
        ops.run(ops.backward(1))
        ops.run(ops.forward(1), ops.backward(0))
    _drain(ops, n, h)


def _main_step(ops: _RankOps, count: int, is_middle: bool) -> None:
    """Step 4, nF0B1F1B0: F&B pairs; the middle rank's first F0 and B1 run apart ("we don't
    overlap these two chunks to further reduce bubble size")."""
    for i in range(count):
        if i == 0 and is_middle:
            ops.run(ops.forward(0))
            ops.run(ops.backward(1))
        else:
            ops.run(ops.forward(0), ops.backward(1))
        ops.run(ops.forward(1), ops.backward(0))


def _drain(ops: _RankOps, n: int, h: int) -> None:
    """Steps 6-8: nB1B0 (zero bubble from the middle on), nWB0, nW."""
    zero_bubble = False
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            zero_bubble = True
        ops.run(ops.backward(1, zero_bubble))
        if i == (h + 1) // 2 and h % 2 == 0:
            zero_bubble = True
        ops.run(ops.backward(0, zero_bubble))
    for _ in range(n - h - 1):
        ops.run(ops.weight())
        ops.run(ops.backward(0, zero_bubble=True))
    for _ in range(h + 1):
        ops.run(ops.weight())


def dualpipe(pp: int, m: int) -> OpSchedule:
    """DualPipe on `pp` ranks with `m` micro-batches, m/2 from each end (dualpipe.py step)."""
    _check(pp, m, "pp")
    if pp % 2:
        raise UserError("pp", f"DualPipe needs an even number of ranks (dualpipe.py asserts "
                              f"it), got {pp}")
    if m % 2 or m < 2 * pp:
        raise UserError("m", f"DualPipe needs an even m >= 2 x pp (dualpipe.py asserts it), "
                             f"got pp={pp}, m={m}")
    n, c = pp // 2, m // 2
    ranks = []
    for rank in range(pp):
        second_half = rank >= n
        chunk_of_phase = (1, 0) if second_half else (0, 1)
        ops = _RankOps(chunk_of_phase, tuple(chunk * c for chunk in chunk_of_phase))
        _eight_steps(ops, n, min(rank, pp - 1 - rank), c, rank in (n - 1, n))
        ranks.append(tuple(ops.ops))
    down = tuple((rank, 0) for rank in range(pp))
    up = tuple((rank, 1) for rank in reversed(range(pp)))
    return OpSchedule("dualpipe", tuple(ranks), tuple([down] * c + [up] * c))


def dualpipev(ranks: int, m: int) -> OpSchedule:
    """DualPipeV on `ranks` devices (2 x ranks stages) with `m` micro-batches (dualpipev.py)."""
    _check(ranks, m, "ranks")
    if m < 2 * ranks:
        raise UserError("m", f"DualPipeV needs m >= 2 x ranks (dualpipev.py asserts it), "
                             f"got ranks={ranks}, m={m}")
    program = []
    for rank in range(ranks):
        ops = _RankOps((0, 1), (0, 0))
        _eight_steps(ops, ranks, rank, m, rank == ranks - 1)
        program.append(tuple(ops.ops))
    route = tuple((rank, 0) for rank in range(ranks)) + \
        tuple((rank, 1) for rank in reversed(range(ranks)))
    return OpSchedule("dualpipev", tuple(program), tuple([route] * m))


def _check(ranks: int, m: int, field: str) -> None:
    """Ranks and micro-batches must be positive integers."""
    for name, value in ((field, ranks), ("m", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(name, f"must be a positive integer, got {value!r}")


def dualpipev_steps(ranks: int, m: int) -> Schedule:
    """DualPipeV's op lists as the steps a run executes (op_steps)."""
    return op_steps(dualpipev(ranks, m))


def dualpipe_steps(pp: int, m: int) -> Schedule:
    """DualPipe's op lists as the steps a run executes (op_steps): chunk 0 of rank r runs the
    down pipeline's stage r, chunk 1 the up pipeline's stage pp-1-r."""
    return op_steps(dualpipe(pp, m))


def op_steps(schedule: OpSchedule, backward_first: bool = False) -> Schedule:
    """Op lists as run steps: an F&B pair as its F then its backward's B and W (the run
    overlaps them: stage_program.py; `backward_first`: its B and W first, the order in which
    a pair frees its backward's chunk soonest), a full backward BW as B then its W at once (the
    same gradients: dualpipe.py `_backward_chunk(enable_zb=False)`)."""
    return [[step for op in ops
             for task in sorted(op.tasks, key=lambda t: (t.kind != FORWARD) != backward_first)
             for step in _steps_of(task)] for ops in schedule.ops]


def _steps_of(task: Task) -> list[Step]:
    """One task as run steps: F, B or W as itself, BW as B and W."""
    if task.kind == FULL_BACKWARD:
        return [Step(BACKWARD, task.micro_batch, task.chunk),
                Step(WEIGHT, task.micro_batch, task.chunk)]
    return [Step(task.kind, task.micro_batch, task.chunk)]


def pair_forwards(pp: int, m: int, rank: int, name: str = "dualpipe") -> frozenset:
    """The forwards of rank's F&B pairs in DualPipe (or DualPipeV, `name`), as run steps (a pair
    waits both inputs before it starts: upstream's `_commit_and_wait_comm` before
    `_forward_backward_chunk`)."""
    builder = {"dualpipe": dualpipe, "dualpipev": dualpipev}[name]
    return frozenset(Step(task.kind, task.micro_batch, task.chunk)
                     for op in builder(pp, m).ops[rank] if op.is_pair
                     for task in op.tasks if task.kind == FORWARD)


def sent_after_weight(pp: int, m: int, rank: int, name: str = "dualpipe") -> frozenset:
    """The run steps whose output DualPipe (or DualPipeV, `name`) sends only after the W that
    follows: a pair's forward and every full backward BW (upstream computes the pair, or B and
    W in one `_backward_chunk(enable_zb=False)`, then `_send_forward` and `_send_backward`:
    dualpipe.py and dualpipev.py alike); a zero-bubble B sends before its W."""
    builder = {"dualpipe": dualpipe, "dualpipev": dualpipev}[name]
    full = frozenset(Step(BACKWARD, task.micro_batch, task.chunk)
                     for op in builder(pp, m).ops[rank] for task in op.tasks
                     if task.kind == FULL_BACKWARD)
    return pair_forwards(pp, m, rank, name) | full


def defer_sends(program: list, deferred: frozenset) -> list:
    """A split-backward program (p2p_program.split_backward_program) with the calls that send
    a `deferred` step's output moved after the next W step, in their order."""
    out, held = [], []
    for action in program:
        if hasattr(action, "sends") and any(step in deferred for step in action.sends):
            held.append(action)
            continue
        out.append(action)
        if isinstance(action, Step) and action.kind == WEIGHT:
            out += held
            held = []
    return out + held


def pair_steps(name: str, pp: int, m: int, rank: int) -> frozenset:
    """The run steps of rank's F&B pairs under `name` (dualpipe or dualpipev): each pair's F and
    its backward's B and W, as op_steps runs them; empty for any other schedule."""
    builder = {"dualpipe": dualpipe, "dualpipev": dualpipev}.get(name)
    if builder is None:
        return frozenset()
    return frozenset(step for op in builder(pp, m).ops[rank] if op.is_pair
                     for task in op.tasks for step in _steps_of(task))
