"""One training iteration on the simulated cluster: a simpy process per rank, then the results.

`representative=True` (meta mode) simulates only the ranks with tp = 0 and dp = 0: the other
ranks of a TP group or DP replica provably do the same work at the same times, so their
collectives still move their bytes over the links but they are not simulated one by one.
"""

from dataclasses import dataclass
import functools

import numpy as np

from simsp.cluster.grid import RankGrid
from simsp.scenario.config import Scenario
from simsp.engine.communicator import CLOSED_FORM, STEPWISE
from simsp.gc_pause import gc_paused
from simsp.engine.trace import DETAIL_TRACKS, TRACE_DETAILS
from simsp.model.params import init_params, param_shapes
from simsp.model.replay import DirectLayers, LayerTemplates
from simsp.model.weights import allocate_params
from simsp.training.driver.run import NumericData, Run, RunInputs, RunResults
from simsp.training.driver.world import World, build_world
from simsp.training.data_parallel.finalize import finalize_grads
from simsp.training.data_parallel.optimizer import allocate_optimizer, optimizer_step
from simsp.shortcuts.rail_symmetry import RailSymmetry
from simsp.shortcuts.check import check_shortcuts
from simsp.training.pipeline.plan import StagePlan, global_batch, stage_param_names, stage_plans
from simsp.training.pipeline.stage_program import run_schedule
from simsp.training.pipeline.steps import RankState


@dataclass(frozen=True)
class Shortcuts:
    """The scale shortcuts of meta mode, each shown equal to the full simulation in
    tests/test_shortcuts.py: one simulated rank per TP group and DP replica, whole-collective
    timing, and layer templates (which need the other two)."""

    representative: bool = False
    closed_form: bool = False
    templates: bool = False
    # groups whose collectives run step by step under closed_form (they share links with
    # other traffic: shortcuts/check.py)
    stepwise_groups: frozenset = frozenset()
    reasons: tuple = ()  # (shortcut, "used: ..." or "not used: ...") from check_shortcuts
    # representative by rail symmetry: the ranks simulated, per hop its images' links
    # (shortcuts/rail_symmetry.py)
    symmetry: RailSymmetry | None = None
    alone_all_to_all: frozenset = frozenset()  # EP groups whose all-to-alls meet no traffic
    # stepwise groups run as one node's piece of one channel (they meet only themselves)
    segment_groups: frozenset = frozenset()

    @classmethod
    def for_scale(cls, sc: Scenario) -> "Shortcuts":
        """In meta mode every shortcut that is exact for this layout (shortcuts/check.py);
        none in numeric mode, whose numbers need every rank."""
        if sc.run.mode != "meta":
            why = "not used: numeric mode needs every rank and every ring step"
            return cls(reasons=tuple((name, why) for name in
                                     ("representative", "closed_form", "templates")))
        verdict = check_shortcuts(sc)
        if sc.parallel.cp > 1:  # closed form where no ring shares a link with the CP traffic
            why = ("not used: context parallelism's ring attention needs every rank of its CP "
                   "group to run")
            return cls(closed_form=verdict.closed_form, stepwise_groups=verdict.stepwise_groups,
                       reasons=(("representative", why), verdict.reasons[1],
                                ("templates", why)))
        return cls(verdict.representative, verdict.closed_form, verdict.templates,
                   verdict.stepwise_groups, verdict.reasons, verdict.symmetry,
                   verdict.alone_all_to_all, verdict.segment_groups)

    def flags(self) -> dict:
        """The three shortcuts, on or off."""
        return {"representative": self.representative, "closed_form": self.closed_form,
                "templates": self.templates}

    def why(self) -> dict:
        """Per shortcut: used or not, and why (the `shortcuts_used` of metrics.json)."""
        reasons = dict(self.reasons)
        return {name: reasons.get(name, ("used" if on else "not used") + ": as requested")
                for name, on in self.flags().items()}


def rank_program(r, inputs: RunInputs, plan: StagePlan, states: dict, results: RunResults):
    """Allocate the stage's parameters and optimizer (its state goes to states[rank]), run its
    schedule, reduce, step; its steps and end time go to results."""
    state, optimizer = _allocate(r, inputs, plan)
    states[r.rank] = state
    yield from run_schedule(r, inputs, plan, state, results)
    r.phase, r.scope = "backward", ""
    yield from finalize_grads(r, inputs.world, plan, state)
    weights, grads = (state.weights, state.grads) if state.fsdp is None \
        else state.fsdp.optimizer_tensors()
    yield from optimizer_step(r, optimizer, weights, grads)
    yield from state.ddp_buckets.gather_params(r)
    results.end_s[r.rank] = r.env.now


def _allocate(r, inputs: RunInputs, plan: StagePlan) -> tuple[RankState, object]:
    """The stage's parameters, gradients and optimizer, replicated over DP or sharded (FSDP),
    and the activation offload under --cpu-offloading. The FSDP and offload code is imported
    only by a run that uses it."""
    sc, p = inputs.sc, inputs.sc.parallel
    shapes = param_shapes(sc.padded_model)
    shapes = {n: shapes[n] for n in stage_param_names(shapes, plan)}
    canonical = None if inputs.data is None else inputs.data.params
    if p.fsdp is None:
        weights, grads = allocate_params(r, shapes, canonical)
        shard = p.dp * p.cp if p.distributed_optimizer else 1  # over dp_cp_group, as Megatron
        expert_shard = (len(r.moe.edp_group) if p.distributed_optimizer and r.moe is not None
                        else None)
        state = RankState(weights, grads)
        optimizer = allocate_optimizer(r, weights, shard, expert_shard)
    else:  # sharded data parallelism (training/data_parallel/fsdp.py)
        from simsp.training.data_parallel.fsdp import FsdpUnits
        fsdp = FsdpUnits(r, sc, inputs.world.grid, plan, shapes, canonical)
        state, optimizer = RankState(fsdp.weights, fsdp.grads, fsdp=fsdp), fsdp.optimizer
    if p.cpu_offloading:
        from simsp.training.pipeline.offload import ActivationOffload
        state.offload = ActivationOffload(r, sc, plan)
    return state, optimizer


def _simulated_ranks(sc: Scenario, shortcuts: Shortcuts) -> list[int] | None:
    if not shortcuts.representative:
        return None
    if shortcuts.symmetry is not None:  # one rank per orbit of rail symmetry, each stage
        return list(shortcuts.symmetry.ranks)
    p = sc.parallel
    grid = RankGrid(p.tp, p.pp, p.dp)
    ranks = [grid.rank_of(0, 0, pp) for pp in range(p.pp)]
    if sc.model.num_experts is not None and (p.ep > 1 or p.etp > 1):
        return _expert_representatives(sc, ranks)
    return ranks


def _expert_representatives(sc: Scenario, ranks: list[int]) -> list[int]:
    """Under expert parallelism with data-dependent routing, whole expert groups: they exchange
    their own rows (the MoE code is imported only by a run with experts)."""
    from simsp.model.blocks.moe.placement import representatives
    from simsp.model.blocks.moe.routing import uniform_routing
    return ranks if uniform_routing(sc) else representatives(sc, ranks)


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
    world = build_world(sc, simulated=_simulated_ranks(sc, shortcuts),
                        timing=CLOSED_FORM if shortcuts.closed_form else STEPWISE,
                        stepwise_groups=shortcuts.stepwise_groups,
                        image_loads=shortcuts.symmetry.loads if shortcuts.representative and
                        shortcuts.symmetry else None,
                        alone_all_to_all=shortcuts.alone_all_to_all,
                        segment_groups=shortcuts.segment_groups if shortcuts.closed_form
                        else frozenset())
    _set_trace_detail(world, trace)
    inputs = RunInputs(sc, world, stage_plans(sc, world.grid), shortcuts,
                       LayerTemplates() if shortcuts.templates else DirectLayers(),
                       _numeric_data(sc, canonical, embedding_delta))
    results = RunResults(on_step=None if on_step is None
                         else functools.partial(on_step, inputs.total_steps))
    run = Run(inputs, {}, results)
    for rank, r in sorted(world.ranks.items()):
        world.env.process(rank_program(r, inputs, inputs.plans[rank], run.states, results))
    return run


def _numeric_data(sc: Scenario, canonical: dict | None,
                  embedding_delta: np.ndarray | None) -> NumericData | None:
    """Numeric mode's global batch and full parameters (`canonical`, else drawn from the
    seed); None in meta mode."""
    if sc.run.mode != "numeric":
        return None
    tokens, targets = global_batch(sc)
    params = canonical or init_params(sc.padded_model, sc.run.seed,
                                      np.dtype(sc.run.numeric_dtype))
    return NumericData(tokens, targets, params, embedding_delta)


def simulate_iteration(sc: Scenario, shortcuts: Shortcuts = Shortcuts(),
                       canonical: dict | None = None,
                       embedding_delta: np.ndarray | None = None, on_step=None,
                       trace: str = "full", keep_until_exit: bool = False) -> Run:
    """Simulate one iteration; every simulated rank's ledger, counters and trace are kept.

    Numeric mode may pass the full parameters and a perturbation of the embedding output
    (finite differences); `on_step(total_steps, now_s)` is called after every schedule step.
    `trace` ("none", "steps", "full") says which spans are recorded: none, all but compute and
    TP communication, or all; results are the same. `keep_until_exit`: the caller holds the run
    until its process ends (the command line), so its objects are frozen out of later garbage
    collections (gc_pause.py)."""
    if sc.run.mode == "numeric" and shortcuts.representative:
        raise ValueError("numeric mode needs every rank: no representative shortcut")
    if shortcuts.templates and not (shortcuts.representative and shortcuts.closed_form):
        raise ValueError("layer templates need the representative and closed-form shortcuts")
    with gc_paused(freeze=keep_until_exit):  # building the world makes many objects too
        run = _build_run(sc, shortcuts, canonical, embedding_delta, on_step, trace)
        run.inputs.world.env.run()
    run.inputs.layers.settle_counters(run.inputs.world.ranks)
    return run
