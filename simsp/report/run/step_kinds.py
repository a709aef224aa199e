"""What kind each schedule step of a run is, for the colours of the trace and the timeline
figure: F (forward), B (input gradient, or the whole backward when it is not split), W (weight
gradient), or F&B, a step of one of DualPipe's or DualPipeV's F&B pairs (docs/dualpipe.md)."""

from simsp.training.pipeline.dualpipe import pair_steps
from simsp.training.pipeline.schedule_step import Step

# Per kind, a colour of the Chrome trace viewer's reserved palette (an event's "cname"; catapult
# tracing/base/color_scheme.html): cornflower blue, shamrock green, tawny, pink, close to the
# timeline figure's (report/run/figures/schedule.py GANTT_COLORS).
TRACE_COLOURS = {"F": "rail_response", "B": "rail_load", "W": "heap_dump_child_node_arrow",
                 "F&B": "cq_build_failed"}


def paired_steps(run, rank: int) -> frozenset:
    """The steps of `rank`'s F&B pairs (empty unless the run's schedule pairs them)."""
    sc = run.inputs.sc
    stage = run.inputs.world.grid.coords(rank).pp
    return pair_steps(sc.parallel.schedule_name, sc.parallel.pp, sc.parallel.num_micro_batches,
                      stage)


def step_kind(kind: str, micro_batch: int, chunk: int, paired: frozenset) -> str:
    """F, B or W as the step ran, F&B when it belongs to one of the rank's pairs."""
    return "F&B" if paired and Step(kind, micro_batch, chunk) in paired else kind


def span_kind(name: str, paired: frozenset) -> str:
    """The kind of a schedule span named `F3.0` (kind, micro-batch, chunk: training/driver/run.py
    record_step)."""
    micro_batch, _, chunk = name[1:].partition(".")
    return step_kind(name[0], int(micro_batch), int(chunk), paired)
