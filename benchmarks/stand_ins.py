"""What each speed stand-in of the reports saves (docs/PERFORMANCE.md): every figure and the
trace's event text made with the stand-in and with the plain library call it replaces, from one
simulated run, alternating the two so that a loaded machine's drift hits both alike.

    python benchmarks/stand_ins.py [--scenario paper-1t] [--repeats 5] [--json]

Prints per stand-in the best and median seconds of each variant and the saving. The plain
variants are the calls a reader would write first (report/run/figures/drawing.py, pixels.py,
panels.py and stage_ticks.py name what each stand-in replaces); each must draw the same figure (the equivalence tests say how closely).
The PNG writer and memory.png's polygon stack were measured here too and dropped
(docs/PERFORMANCE.md).
"""

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simsp.scenario.loading import load_scenario  # noqa: E402
from simsp.metrics.collect import collect  # noqa: E402
from simsp.engine.memory import CATEGORIES  # noqa: E402
from simsp.report.run.figures import bars as bar_module, drawing  # noqa: E402
from simsp.report.run.figures import memory as memory_figures  # noqa: E402
from simsp.report.run.figures import schedule as schedule_chart  # noqa: E402
from simsp.report.run.figures.bars import exposed_time_bars, memory_at_peak_bars  # noqa: E402
from simsp.report.run.figures.inputs import memory_figures_of, schedule_figure_of  # noqa: E402
from simsp.report.run.figures.pictures import capacity_of  # noqa: E402
from simsp.report.run.figures.schedule import schedule_gantt  # noqa: E402
from simsp.report.run.trace.columns import table  # noqa: E402
from simsp.report.run.trace.events import lane_text, string  # noqa: E402
from simsp.report.run.trace.plan import trace_plan  # noqa: E402
from simsp.training.driver.iteration import Shortcuts, simulate_iteration  # noqa: E402


# ---------------------------------------------------------------------------------------------
# The plain calls
# ---------------------------------------------------------------------------------------------

def plain_stage_ticks(ax, axis: str, labels: list[str], title: str | None = None) -> None:
    """matplotlib's own ticks and axis label."""
    (ax.set_xticks if axis == "x" else ax.set_yticks)(range(len(labels)), labels)
    if title is not None:
        (ax.set_xlabel if axis == "x" else ax.set_ylabel)(title)


def plain_draw_pixels(ax, rgb: np.ndarray) -> None:
    """imshow over the Axes' frame, without resampling (tests/test_pixel_image.py: same pixels)."""
    ax.imshow(rgb, extent=(0, 1, 0, 1), transform=ax.transAxes, interpolation="none",
              aspect="auto", origin="upper", zorder=0)


def plain_memory_over_time(inputs) -> bytes | None:
    """The every-stage memory figure with an Axes per panel and stackplot in each."""
    stages, end_s = inputs.memory, inputs.end_s
    capacity = stages[0].capacity_bytes
    y_top = max(max(m.peak_total for m in stages), capacity) * memory_figures.HEADROOM
    (unit, scale), (_, tscale) = drawing.memory_unit(y_top / memory_figures.HEADROOM), \
        drawing.time_unit(end_s)
    cols = min(memory_figures.COLS, len(stages))
    rows = -(-len(stages) // cols)
    fig = drawing.new_figure(13.0, 0.8 + rows * 1.9 + 0.55)
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, memory in zip(axes, stages):
        times, state = memory.timeline(memory_figures.MEMORY_POINTS)
        times = np.append(times, max(end_s, times[-1]))
        state = np.vstack([state, state[-1:]])
        ax.stackplot(times / tscale, state.T / scale, step="post", linewidth=0,
                     colors=[memory_figures.COLORS[c] for c in CATEGORIES])
        ax.axhline(capacity / scale, color="black", linestyle="--", linewidth=1)
        ax.set_title(memory_figures._title(memory, ((unit, scale), None))[0], fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(stages):]:
        ax.set_axis_off()
    axes[0].set_xlim(0, end_s / tscale)
    axes[0].set_ylim(0, y_top / scale)
    fig.suptitle(f"Memory over one iteration, every pipeline stage: {inputs.label}")
    fig.subplots_adjust(left=0.06, right=0.99, top=1 - 0.8 / fig.get_size_inches()[1],
                        bottom=0.55 / fig.get_size_inches()[1], hspace=0.5)
    return drawing.png_bytes(fig)


def plain_lane_text(lane, names: list[str]) -> str:
    """A lane's X events formatted a row at a time in Python (the same text as lane_text)."""
    head = (f'{{"ph":"X","cat":{string(lane.cat)},"pid":{lane.pid},"tid":{lane.tid},'
            f'"name":')
    keys = [string(k) for k in lane.arg_keys]
    rows = []
    for i, (name, start, dur) in enumerate(zip(lane.names.tolist(), lane.start_ns.tolist(),
                                               lane.dur_ns.tolist())):
        if lane.arg_texts is not None:
            args = lane.arg_texts[i]
        elif keys:
            args = ',"args":{' + ",".join(f"{k}:{round(v, 9)!r}" for k, v in
                                          zip(keys, lane.arg_values[i].tolist())) + "}"
        else:
            args = ""
        rows.append(f'{head}{names[name]},"ts":{start / 1e3!r},"dur":{dur / 1e3!r}{args}}}')
    return ",".join(rows)


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

@contextmanager
def patched(module, name: str, value):
    """`module.name` replaced by `value` inside the block."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def alternate(stand_in, plain, repeats: int) -> tuple[list[float], list[float]]:
    """CPU seconds of each call, the two alternated `repeats` times (after one warm call each)."""
    stand_in(), plain()
    times = ([], [])
    for _ in range(repeats):
        for made, call in zip(times, (stand_in, plain)):
            start = time.process_time()
            call()
            made.append(time.process_time() - start)
    return times


def cases(run, metrics: dict) -> dict:
    """name -> (stand-in call, plain call) over this run's figures and trace."""
    memory = memory_figures_of(run, "bench")
    schedule = schedule_figure_of(run, "bench")
    capacity = capacity_of(run)
    plan = trace_plan(run, "steps")
    lanes = [item for _, items in plan.ranks for item in items if not isinstance(item, str)]
    name_table = table(plan.names)

    def with_plain(modules, name, value, call):
        def plain():
            with ExitStack() as stack:
                for module in modules:
                    stack.enter_context(patched(module, name, value))
                return call()
        return plain

    def bar_charts():
        exposed_time_bars(metrics, "bench")
        memory_at_peak_bars(metrics, capacity, "bench")

    return {
        "stage ticks (schedule + 2 bar charts)": (
            lambda: (schedule_gantt(schedule), bar_charts()),
            with_plain((schedule_chart, bar_module), "stage_ticks", plain_stage_ticks,
                       lambda: (schedule_gantt(schedule), bar_charts()))),
        "pixel blit (schedule)": (
            lambda: schedule_gantt(schedule),
            with_plain((schedule_chart,), "draw_pixels", plain_draw_pixels,
                       lambda: schedule_gantt(schedule))),
        "pixel shares vs every bar (schedule)": (
            lambda: schedule_gantt(schedule),
            with_plain((schedule_chart,), "median_bar_px", lambda *a: np.inf,
                       lambda: schedule_gantt(schedule))),
        "one sheet for all panels (memory_stages.png)": (
            lambda: memory_figures.memory_over_time(memory),
            lambda: plain_memory_over_time(memory)),
        "column encoder (trace X events)": (
            lambda: [lane_text(lane, name_table) for lane in lanes],
            lambda: [plain_lane_text(lane, plan.names) for lane in lanes]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="paper-1t")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None, help="case names containing these")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sc = load_scenario(str(ROOT / "scenarios" / f"{args.scenario}.toml"))
    shortcuts = Shortcuts.for_scale(sc)
    run = simulate_iteration(sc, shortcuts, trace="steps")
    metrics = collect(run, shortcuts)
    rows = []
    for name, (stand_in, plain) in cases(run, metrics).items():
        if args.only and not any(word in name for word in args.only):
            continue
        ours, theirs = alternate(stand_in, plain, args.repeats)
        rows.append({"stand_in": name, "best_s": min(ours), "median_s": statistics.median(ours),
                     "plain_best_s": min(theirs), "plain_median_s": statistics.median(theirs)})
        if not args.json:
            row = rows[-1]
            print(f"{name:46s} stand-in {row['best_s']:7.3f} s (median {row['median_s']:.3f})"
                  f"  plain {row['plain_best_s']:7.3f} s (median {row['plain_median_s']:.3f})"
                  f"  saves {row['plain_best_s'] - row['best_s']:+.3f} s", flush=True)
    if args.json:
        print(json.dumps({"scenario": args.scenario, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
