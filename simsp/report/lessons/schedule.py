"""The pipeline-schedule lesson's model: 1F1B, ZB-H1, DualPipe and DualPipeV on the same ranks and
micro-batches, each op's start derived (its rank free, its input there), every rank's bubble
against the published closed form, and the activations each rank holds.

Op lists: training/pipeline/op_schedules.py (1F1B, ZB-H1 after the ZB paper, arXiv:2401.10241
§3.1, Figure 3) and training/pipeline/dualpipe.py (deepseek-ai/DualPipe); times:
training/pipeline/op_timing.py. Closed forms: DeepSeek-V3 report (arXiv:2412.19437) Table 2, its
B the full backward (B + W here) and PP the stages (DualPipeV: two per rank). DualPipeV's chunks
are half a stage of the others', so its per-chunk times are halved: every schedule then does the
same work per micro-batch and rank (docs/dualpipe.md).
"""
from dataclasses import replace

from simsp.errors import UserError
from simsp.training.pipeline.dualpipe import dualpipe, dualpipev
from simsp.training.pipeline.op_schedules import one_f_one_b_ops, zb_h1_ops
from simsp.training.pipeline.op_step import OpSchedule
from simsp.training.pipeline.op_timing import (Durations, OpTimeline, needs, outputs,
                                               peak_activations, simulate_ops)

# name -> (title, generator (ranks, m), stages per rank, closed-form bubble, its expression)
SCHEDULES = {
    "1f1b": ("1F1B", one_f_one_b_ops, 1,
             lambda pp, f, b, w, fb: (pp - 1) * (f + b), "(PP-1)(F+B)"),
    "zb-h1": ("ZB-H1", zb_h1_ops, 1,
              lambda pp, f, b, w, fb: (pp - 1) * (f + b - 2 * w), "(PP-1)(F+B-2W)"),
    "dualpipe": ("DualPipe", dualpipe, 1,
                 lambda pp, f, b, w, fb: (pp / 2 - 1) * (fb + b - 3 * w), "(PP/2-1)(F&B+B-3W)"),
    "dualpipev": ("DualPipeV", dualpipev, 2,
                  lambda pp, f, b, w, fb: (pp / 2 - 1) * (fb + b - 3 * w), "(PP/2-1)(F&B+B-3W)"),
}
FLAG_OF = {"pp": "--ranks", "ranks": "--ranks", "m": "--micro-batches"}


def chunk_durations(durations: Durations, stages_per_rank: int) -> Durations:
    """Per-chunk times when a rank holds `stages_per_rank` chunks of one stage's layers."""
    if stages_per_rank == 1:
        return durations
    pair = None if durations.pair is None else durations.pair / stages_per_rank
    return replace(durations, forward=durations.forward / stages_per_rank,
                   input_grad=durations.input_grad / stages_per_rank,
                   weight_grad=durations.weight_grad / stages_per_rank, pair=pair)


def build(name: str, ranks: int, m: int) -> OpSchedule:
    """The named schedule; a size it refuses is an error naming the command's flag."""
    try:
        return SCHEDULES[name][1](ranks, m)
    except UserError as exc:
        raise UserError(FLAG_OF.get(exc.field, exc.field), f"{name}: {exc.reason}") from None


def schedule_lesson(name: str, ranks: int, m: int, durations: Durations) -> dict:
    """One schedule's ops with their derived starts, bubbles and activations, as plain data."""
    title, _generator, per_rank, closed_form, expression = SCHEDULES[name]
    schedule = build(name, ranks, m)
    times = chunk_durations(durations, per_rank)
    timeline = simulate_ops(schedule, times)
    pp = ranks * per_rank
    full_backward = times.input_grad + times.weight_grad
    pair = times.forward + full_backward if times.pair is None else times.pair
    published = closed_form(pp, times.forward, full_backward, times.weight_grad, pair)
    return {"name": name, "title": title, "ranks": ranks, "micro_batches": m, "stages": pp,
            "stages_per_rank": per_rank, "iteration_time": timeline.iteration_time,
            "ops": _derived_ops(schedule, timeline),
            "bubble": [timeline.bubble(rank) for rank in range(ranks)],
            "bubble_formula": expression, "bubble_published": published,
            "activations": peak_activations(schedule),
            "activations_published": _published_activations(name, pp)}


def _published_activations(name: str, pp: int) -> int:
    """Table 2's activations per device, in stage activations: PP, or PP + 1 for DualPipe(V)."""
    return pp + 1 if name.startswith("dualpipe") else pp


def _derived_ops(schedule: OpSchedule, timeline: OpTimeline) -> list[list[dict]]:
    """Per rank, each op: label, kinds, start, end and why it starts then."""
    producer = {}  # output key -> (rank, op label, end)
    for rank, spans in enumerate(timeline.spans):
        for span in spans:
            for task in span.op.tasks:
                for key in outputs(schedule, task, rank):
                    producer[key] = (rank, str(span.op), span.end)
    ranks = []
    for rank, spans in enumerate(timeline.spans):
        rows, free = [], 0.0
        for span in spans:
            inputs = [producer[key] for key in (needs(schedule, t, rank) for t in span.op.tasks)
                      if key is not None]
            rows.append({"label": str(span.op), "kinds": [t.kind for t in span.op.tasks],
                         "start": span.start, "end": span.end, "free": free,
                         "input": max(inputs, key=lambda found: found[2], default=None)})
            free = span.end
        ranks.append(rows)
    return ranks


def why(op: dict, rank: int) -> str:
    """'starts at 5 = max(rank free at 4, F3.0 from rank 1 at 5)' for one op of the lesson."""
    parts = [f"rank {rank} free at {number(op['free'])}"]
    if op["input"] is not None:
        source_rank, label, end = op["input"]
        where = "this rank" if source_rank == rank else f"rank {source_rank}"
        parts.append(f"{label} on {where} done at {number(end)}")
    return f"{op['label']} starts at {number(op['start'])} = max({', '.join(parts)})"


def number(value: float) -> str:
    """A time of the lesson in units: '5', '2.5', '0.667'."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def lesson(names: list[str], ranks: int, m: int, durations: Durations) -> dict:
    """Every named schedule's lesson and the times they share."""
    return {"ranks": ranks, "micro_batches": m,
            "durations": {"F": durations.forward, "B": durations.input_grad,
                          "W": durations.weight_grad,
                          "F&B": durations.pair if durations.pair is not None else
                          durations.forward + durations.input_grad + durations.weight_grad},
            "schedules": [schedule_lesson(name, ranks, m, durations) for name in names]}
