"""One training iteration on the simulated cluster: a simpy process per rank, then the results.

`representative=True` (meta mode) simulates only the ranks with tp = 0 and dp = 0: the other
ranks of a TP group or DP replica provably do the same work at the same times, so their
collectives still move their bytes over the links but they are not simulated one by one.
"""

from dataclasses import dataclass, field

import numpy as np

from simsp.scenario.config import Scenario
from simsp.gc_pause import gc_paused
from simsp.engine.trace import DETAIL_TRACKS, TRACE_DETAILS
from simsp.model.params import init_params, param_shapes
from simsp.model.replay import DirectLayers, LayerTemplates
from simsp.model.weights import allocate_params
from simsp.training.driver.world import World, build_world
from simsp.training.pipeline import p2p
from simsp.training.data_parallel.finalize import data_parallel_gather_params, finalize_grads
from simsp.training.data_parallel.fsdp import FsdpUnits
from simsp.training.data_parallel.offload import ActivationOffload
from simsp.training.data_parallel.optimizer import allocate_optimizer, optimizer_step
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.plan import timing_plan
from simsp.training.pipeline.plan import StagePlan, global_batch, stage_param_names, stage_plans
from simsp.training.pipeline.stage_program import run_schedule
from simsp.training.pipeline.steps import RankState


@dataclass
class Run:
    """State shared by all rank programs of one iteration."""

    sc: Scenario
    world: World
    plans: dict
    mailbox: p2p.Mailbox
    tokens: np.ndarray | None = None  # (s, B)
    targets: np.ndarray | None = None  # (s, B)
    canonical: dict | None = None  # full parameters (numeric mode)
    embedding_delta: np.ndarray | None = None  # (s, B, h) added to the embedding output
    embedding_grads: dict = field(default_factory=dict)  # (tp, dp, mb, cp) -> grad at emb. output
    losses: dict = field(default_factory=dict)  # (dp, micro_batch, cp) -> summed token loss
    mtp_losses: dict = field(default_factory=dict)  # (dp, micro_batch, depth) -> masked sum
    tied_embedding_arrivals: dict = field(default_factory=dict)  # group -> {rank: arrival_s}
    shortcuts: Shortcuts = Shortcuts()  # which scale shortcuts this run takes
    layers: object = field(default_factory=DirectLayers)  # LayerTemplates if shortcuts.templates
    states: dict = field(default_factory=dict)  # rank -> RankState
    end_s: dict = field(default_factory=dict)  # rank -> time its program finished
    steps: dict = field(default_factory=dict)  # rank -> [(kind, mb, chunk, begin_s, end_s)]
    on_step: object = None  # optional callback(run, now_s) after every schedule step (progress)

    def record_step(self, r, kind: str, mb: int, chunk: int, begin_s: float) -> None:
        """A schedule step's busy interval: from its input's arrival to its end."""
        now = r.env.now
        self.steps.setdefault(r.rank, []).append((kind, mb, chunk, begin_s, now))
        if r.trace is not None:
            r.trace.add_span(r.rank, "schedule", f"{kind}{mb}.{chunk}", begin_s, now)
        if self.on_step is not None:
            self.on_step(self, now)

    @property
    def total_steps(self) -> int:
        """Schedule steps of all simulated ranks in this iteration (the progress bar's total)."""
        return sum(len(self.plans[rank].steps) for rank in self.world.ranks)

    def rank_of(self, tp: int, dp: int, pp: int, cp: int = 0) -> int:
        return self.world.grid.rank_of(tp, dp, pp, cp)

    @property
    def loss(self) -> float | None:
        """Mean token loss over the global batch (numeric mode)."""
        if not self.losses or None in self.losses.values():
            return None
        m, p = self.sc.model, self.sc.parallel
        return sum(self.losses.values()) / (m.seq_length * p.global_batch)

    @property
    def objective(self) -> float | None:
        """What backward differentiates: the loss plus the MoE layers' aux losses and the
        multi-token prediction losses, each scaled as its gradient is (docs/moe.md,
        docs/mtp.md); the loss itself without either."""
        loss = self.loss
        if loss is None:
            return loss
        m, B = self.sc.model, self.sc.parallel.global_batch
        if m.num_experts is not None:
            loss += sum(r.moe_aux_loss for r in self.world.ranks.values())
        for (_dp, _mb, k), masked in self.mtp_losses.items():  # depth k: s − k − 1 positions
            loss += m.mtp_loss_scaling_factor / m.mtp_num_layers * masked / (
                (m.seq_length - k - 1) * B)
        return loss


def rank_program(r, run: Run, plan: StagePlan):
    """Allocate the stage's parameters and optimizer, run its schedule, reduce, step."""
    shapes = param_shapes(run.sc.padded_model)
    names = stage_param_names(shapes, plan)
    p = run.sc.parallel
    if p.fsdp is None:
        weights, grads = allocate_params(r, {n: shapes[n] for n in names}, run.canonical)
        shard = p.dp * p.cp if p.distributed_optimizer else 1  # over dp_cp_group, as Megatron
        expert_shard = (len(r.moe.edp_group) if p.distributed_optimizer and r.moe is not None
                        else None)
        optimizer, fsdp = allocate_optimizer(r, weights, shard, expert_shard), None
    else:  # sharded data parallelism (training/data_parallel/fsdp.py)
        fsdp = FsdpUnits(r, run, plan, {n: shapes[n] for n in names})
        weights, grads, optimizer = fsdp.weights, fsdp.grads, fsdp.optimizer
    state = run.states[r.rank] = RankState(weights, grads, fsdp=fsdp)
    if p.cpu_offloading:
        state.offload = ActivationOffload(r, run, plan)
    yield from run_schedule(r, run, plan, state)
    r.phase, r.scope = "backward", ""
    yield from finalize_grads(r, run, plan, grads)
    if fsdp is not None:
        weights, grads = fsdp.optimizer_tensors()
    yield from optimizer_step(r, optimizer, weights, grads)
    yield from data_parallel_gather_params(r, run, weights)
    run.end_s[r.rank] = r.env.now


def _set_trace_detail(world: World, detail: str) -> None:
    """Record no spans ("none"), all but the detail tracks ("steps"), or every span ("full")."""
    if detail not in TRACE_DETAILS:
        raise ValueError(f"trace detail must be one of {TRACE_DETAILS}, got {detail!r}")
    if detail == "none":
        for r in world.ranks.values():
            r.trace = None
    elif detail == "steps":
        world.trace.skip = frozenset(DETAIL_TRACKS)


def _build_run(sc: Scenario, shortcuts: Shortcuts, canonical: dict | None,
               embedding_delta: np.ndarray | None, on_step, trace: str) -> Run:
    """The world, the plans and one simpy process per simulated rank, ready to run."""
    plan = timing_plan(sc, shortcuts)  # decided before the run (shortcuts/plan.py)
    world = build_world(sc, simulated=plan.simulated, timing_of=plan.timing_of,
                        image_loads=plan.image_loads)
    _set_trace_detail(world, trace)
    run = Run(sc, world, stage_plans(sc, world.grid), p2p.Mailbox(world.env), on_step=on_step,
              shortcuts=shortcuts)
    if shortcuts.templates:
        run.layers = LayerTemplates()
    if sc.run.mode == "numeric":
        run.tokens, run.targets = global_batch(sc)
        run.canonical = canonical or init_params(sc.padded_model, sc.run.seed,
                                                 np.dtype(sc.run.numeric_dtype))
        run.embedding_delta = embedding_delta
    for rank, r in sorted(world.ranks.items()):
        world.env.process(rank_program(r, run, run.plans[rank]))
    return run


def simulate_iteration(sc: Scenario, shortcuts: Shortcuts = Shortcuts(),
                       canonical: dict | None = None,
                       embedding_delta: np.ndarray | None = None, on_step=None,
                       trace: str = "full", keep_until_exit: bool = False) -> Run:
    """Simulate one iteration; every simulated rank's ledger, counters and trace are kept.

    Numeric mode may pass the full parameters and a perturbation of the embedding output
    (finite differences); `on_step(run, now_s)` is called after every schedule step. `trace`
    ("none", "steps", "full") says which spans are recorded: none, all but compute and TP
    communication, or all; results are the same. `keep_until_exit`: the caller holds the run
    until its process ends (the command line), so its objects are frozen out of later garbage
    collections (gc_pause.py)."""
    if sc.run.mode == "numeric" and shortcuts.representative:
        raise ValueError("numeric mode needs every rank: no representative shortcut")
    if shortcuts.templates and not (shortcuts.representative and shortcuts.closed_form):
        raise ValueError("layer templates need the representative and closed-form shortcuts")
    with gc_paused(freeze=keep_until_exit):  # building the world makes many objects too
        run = _build_run(sc, shortcuts, canonical, embedding_delta, on_step, trace)
        run.world.env.run()
    run.layers.settle_counters(run.world.ranks)
    return run
