"""One training iteration on the simulated cluster: a simpy process per rank, then the results.

`representative=True` (meta mode) simulates only the ranks with tp = 0 and dp = 0: the other
ranks of a TP group or DP replica provably do the same work at the same times, so their
collectives still move their bytes over the links but they are not simulated one by one.
"""

import functools

import numpy as np

from simsp.scenario.config import Scenario
from simsp.gc_pause import gc_paused
from simsp.engine.slice_clocks import SlicesRefused
from simsp.engine.trace import DETAIL_TRACKS, TRACE_DETAILS
from simsp.model.params import init_params, param_shapes
from simsp.model.replay import DirectLayers, LayerTemplates
from simsp.model.weights import allocate_params
from simsp.training.driver.run import NumericData, Run, RunInputs, RunResults
from simsp.training.driver.world import World, build_world
from simsp.training.data_parallel.finalize import finalize_grads
from simsp.training.data_parallel.optimizer import (allocate_optimizer, chained_step,
                                                    optimizer_step, zero_grad_buffer)
from simsp.shortcuts.check import Shortcuts
from simsp.shortcuts.plan import cp_shadow_why_not, timing_plan
from simsp.training.pipeline.plan import StagePlan, global_batch, stage_param_names, stage_plans
from simsp.training.pipeline.stage_program import run_schedule
from simsp.training.pipeline.step_replay import StepReplays
from simsp.training.pipeline.steps import RankState


def rank_program(r, inputs: RunInputs, plan: StagePlan, states: dict, results: RunResults):
    """Allocate the stage's parameters and optimizer (its state goes to states[rank]), run its
    schedule, reduce, step; its steps and end time go to results."""
    state, optimizer = _allocate(r, inputs, plan)
    states[r.rank] = state
    if inputs.sc.parallel.fsdp != "fsdp2":  # torch's FSDP2 wrapper zeroes no buffer
        yield from zero_grad_buffer(r, state.grads if state.fsdp is None
                                    else state.fsdp.optimizer_tensors()[1])
    yield from run_schedule(r, inputs, plan, state, results)
    r.phase, r.scope = "backward", ""
    yield from finalize_grads(r, inputs.world, plan, state)
    weights, grads = (state.weights, state.grads) if state.fsdp is None \
        else state.fsdp.optimizer_tensors()
    if state.fsdp is None and state.ddp_buckets.gather_with_step:
        yield from chained_step(r, optimizer, weights, grads, state.ddp_buckets)
    else:
        yield from optimizer_step(r, optimizer, weights, grads)
        yield from state.ddp_buckets.gather_params(r)
    results.end_s[r.rank] = r.env.now
    slices = getattr(r.cp, "slices", None)
    if slices is not None and r.cp.shadows is not None:  # its shadows' ends: their clocks
        slices.ends[r.rank] = slices.clocks.now


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
               embedding_delta: np.ndarray | None, on_step, trace: str,
               shadows: bool = True) -> Run:
    """The world, the plans and one simpy process per simulated rank (but CP shadows: none
    where `shadows` is off), ready to run."""
    plan = timing_plan(sc, shortcuts)  # decided before the run (shortcuts/plan.py)
    world = build_world(sc, simulated=plan.simulated, timing_of=plan.timing_of,
                        image_loads=plan.image_loads, link_reps=plan.link_reps,
                        pieces=plan.pieces, pair_orbits=plan.pair_orbits)
    world.comm.twins = plan.twins  # FSDP replicas' kinds, for their rings' pieces
    _set_trace_detail(world, trace)
    for rank in plan.replayed:  # timing only: replica 0's ranks are the ones reported
        world.ranks[rank].trace = None
    inputs = RunInputs(sc, world, stage_plans(sc, world.grid), shortcuts,
                       LayerTemplates() if shortcuts.templates else DirectLayers(),
                       _numeric_data(sc, canonical, embedding_delta),
                       StepReplays(plan.replayed) if plan.replayed else None)
    results = RunResults(on_step=None if on_step is None
                         else functools.partial(on_step, inputs.total_steps))
    run = Run(inputs, {}, results)
    shadowed = _cp_shadows(sc, shortcuts, world, trace) if shadows else frozenset()
    for rank, r in sorted(world.ranks.items()):
        if rank not in shadowed:
            world.env.process(rank_program(r, inputs, inputs.plans[rank], run.states, results))
    return run


def _cp_shadows(sc: Scenario, shortcuts: Shortcuts, world: World, trace: str) -> frozenset:
    """The CP ranks that run as their leader's shadows (training/context_parallel/shadows.py)
    where shortcuts/plan.py cp_shadow_why_not finds nothing against it; else none."""
    if cp_shadow_why_not(sc, shortcuts, trace):
        return frozenset()
    from simsp.training.context_parallel import attention  # CP runs only
    from simsp.training.context_parallel.shadows import CpShadows
    grid = world.grid
    leaders = {group[0]: group for group in grid.groups("cp") if group[0] in world.ranks}
    if not leaders or any(world.ranks[lead].cp.lone is None or not attention.charged_apart(
            world.ranks[lead]) for lead in leaders):
        return frozenset()  # calls not worked out in arithmetic: each rank's call its own
    world.shadows = CpShadows(world, leaders)
    return world.shadows.shadowed()


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
        try:
            run.inputs.world.env.run()
        except SlicesRefused:  # a CP shadow could not be followed: every rank its own program
            run.inputs.world.release()
            run = _build_run(sc, shortcuts, canonical, embedding_delta, on_step, trace, False)
            run.inputs.world.env.run()
    run.inputs.layers.settle_counters(run.inputs.world.ranks)
    if getattr(run.inputs.world, "shadows", None) is not None:
        run.inputs.world.shadows.settle(run.results)
    if run.inputs.replays is not None:
        run.inputs.replays.settle_counters(run.inputs.world.ranks)
    return run
