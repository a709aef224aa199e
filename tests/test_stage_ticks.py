"""Stage ticks drawn without Tick objects (report/stage_ticks.py) sit where matplotlib's own
ticks put their labels, marks and the axis title (measured on the rendered figure)."""

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from simsp.report.run.figures.drawing import add_axes_in, new_figure
from simsp.report.run.figures.stage_ticks import stage_ticks

LABELS = [f"stage {s}" for s in range(12)]


def _axes():
    fig = new_figure(8.0, 5.0)
    ax = add_axes_in(fig, 1.2, 0.9, 0.2, 0.3)
    ax.set_xlim(-0.7, len(LABELS) - 0.3)
    ax.set_ylim(len(LABELS) - 0.5, -0.5)
    return fig, ax


def _boxes(fig, texts) -> np.ndarray:
    """(n, 4) x0, y0, x1, y1 in pixels of the rendered texts."""
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    return np.array([t.get_window_extent(renderer).extents for t in texts])


@pytest.mark.parametrize("axis", ["x", "y"])
def test_labels_sit_where_matplotlib_ticks_put_them(axis):
    fig, ax = _axes()
    (ax.set_xticks if axis == "x" else ax.set_yticks)(range(len(LABELS)), LABELS)
    theirs = _boxes(fig, ax.get_xticklabels() if axis == "x" else ax.get_yticklabels())
    fig, ax = _axes()
    stage_ticks(ax, axis, LABELS)
    ours = _boxes(fig, ax.texts)
    assert ours == pytest.approx(theirs, abs=0.5)


def test_marks_are_matplotlib_tick_markers_at_each_stage():
    fig, ax = _axes()
    stage_ticks(ax, "y", LABELS)
    (marks,) = ax.lines
    assert list(marks.get_ydata()) == list(range(len(LABELS)))
    assert marks.get_markersize() == 3.5 and marks.get_marker() == 0  # TICKLEFT, rc default


def test_the_axis_title_sits_below_the_labels_as_matplotlib_puts_it():
    fig, ax = _axes()
    ax.set_xticks(range(len(LABELS)), [str(s) for s in range(len(LABELS))])
    ax.set_xlabel("pipeline stage")
    theirs = _boxes(fig, [ax.xaxis.label])
    fig, ax = _axes()
    stage_ticks(ax, "x", [str(s) for s in range(len(LABELS))], title="pipeline stage")
    ours = _boxes(fig, [ax.xaxis.label])
    assert ours == pytest.approx(theirs, abs=1.0)  # sub-pixel: text measured without hinting


def test_an_unknown_axis_is_refused():
    fig, ax = _axes()
    with pytest.raises(ValueError, match="axis"):
        stage_ticks(ax, "z", LABELS)
