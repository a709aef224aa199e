"""`simsp schedule`'s text: per schedule its iteration time, bubble and activations against the
published closed forms (report/lessons/schedule.py), and with --explain every op's derived start."""
from simsp.report.lessons.schedule import number, why


def summary_lines(data: dict) -> list[str]:
    """The table: one row per schedule, simulated against published."""
    times = data["durations"]
    lines = [f"{data['ranks']} ranks, {data['micro_batches']} micro-batches; per stage F = "
             f"{number(times['F'])}, B = {number(times['B'])} (input gradient), W = "
             f"{number(times['W'])} (weight gradient), F&B = {number(times['F&B'])} (units)",
             "", f"{'schedule':<10} {'stages':>6} {'iteration':>9} {'bubble/rank':>11} "
             f"{'published':>9}  {'formula':<20} {'peak act.':>9} {'published':>9}"]
    for s in data["schedules"]:
        bubble = max(s["bubble"])
        lines.append(f"{s['title']:<10} {s['stages']:>6} {number(s['iteration_time']):>9} "
                     f"{number(bubble):>11} {number(s['bubble_published']):>9}  "
                     f"{s['bubble_formula']:<20} {max(s['activations']):>9} "
                     f"{s['activations_published']:>9}")
    lines += ["", "B in the formulas is the full backward (B + W), as the DeepSeek-V3 report's "
                  "Table 2 writes it; peak activations count stage activations (a DualPipeV "
                  "chunk is half a stage)."]
    return lines


def explain_lines(data: dict) -> list[str]:
    """Every op of every schedule, rank by rank, with why it starts when it does."""
    lines = []
    for s in data["schedules"]:
        lines += ["", f"{s['title']}: iteration {number(s['iteration_time'])}"]
        for rank, ops in enumerate(s["ops"]):
            lines.append(f"  rank {rank} (bubble {number(s['bubble'][rank])}, peak "
                         f"{s['activations'][rank]} activations)")
            lines += [f"    {why(op, rank)}, ends at {number(op['end'])}" for op in ops]
    return lines
