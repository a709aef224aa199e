"""The figure machinery every report figure is drawn with: blank figures on the Agg canvas and
their PNG bytes, display units, and stacked step areas as polygons. The stand-ins for matplotlib
calls that cost more than the rest of a large figure live beside it: pixels.py (exact pixel
coverage of many intervals, a pixel-exact image blit), panels.py (small multiples in one Axes),
stage_ticks.py (stage tick labels).

Each stand-in exists for speed (docs/PERFORMANCE.md#reports-formatting-a-column-at-a-time) and
has its geometry checked in tests/test_figure_geometry.py, tests/test_pixel_image.py and
tests/test_stage_ticks.py.
"""

import io

import numpy as np

from simsp.units import GiB, MiB


# ---------------------------------------------------------------------------------------------
# Canvas: blank figures and their PNG bytes
# ---------------------------------------------------------------------------------------------
#
# Blank matplotlib figures on the Agg canvas, laid out with fixed margins, and their PNG bytes.
#
# The object-oriented API (Figure + FigureCanvasAgg): no pyplot, no figure manager, no global
# state, and matplotlib is imported only when a figure is drawn. Margins are given in inches, so
# a figure's layout is a closed form of its size (no tight_layout, which measures every artist).

DPI = 100  # every report PNG


def new_figure(width_in: float, height_in: float):
    """An empty Figure of that size on an Agg canvas, or None when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401  (first: a blocked matplotlib must stop here)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def add_axes_in(fig, left: float, bottom: float, right: float, top: float):
    """An Axes whose frame sits `left`, `bottom`, `right`, `top` inches inside the figure."""
    width, height = fig.get_size_inches()
    return fig.add_axes((left / width, bottom / height, 1 - (left + right) / width,
                         1 - (bottom + top) / height))


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes with no varying metadata (the same run gives the same bytes)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def warm_up() -> None:
    """Import matplotlib and draw a line of text, so that the first real figure finds the
    modules and fonts loaded (the painter process does this while the simulation runs)."""
    fig = new_figure(1.0, 1.0)
    if fig is not None:
        fig.text(0.1, 0.5, "stage 0: 1.5 GiB")
        png_bytes(fig)


# ---------------------------------------------------------------------------------------------
# Display units
# ---------------------------------------------------------------------------------------------
#
# Display units of the report figures: bytes in GiB or MiB, seconds in s, ms or us.

def memory_unit(nbytes: float) -> tuple[str, int]:
    """GiB for paper models, MiB for the toys."""
    return ("GiB", GiB) if nbytes >= GiB else ("MiB", MiB)


def time_unit(seconds: float) -> tuple[str, float]:
    """s, ms or us for the time axis."""
    return next(((n, v) for n, v in (("s", 1.0), ("ms", 1e-3)) if seconds >= v), ("us", 1e-6))


# ---------------------------------------------------------------------------------------------
# Stacked step areas
# ---------------------------------------------------------------------------------------------
#
# Stacked step areas as polygons built with numpy (what stackplot(step="post") draws, without
# one fill_between per layer): each layer's area lies between the running sums below and above it,
# and every value holds from its time to the next.

def step_path(times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(x, y) of a post-step line through `values` (n,) at `times` (n,): each value holds until
    the next time. Returns (2n - 1, 2): (t0, v0), (t1, v0), (t1, v1), ..., (t_last, v_last)."""
    xs = np.repeat(times, 2)[1:]  # (2n - 1,)
    ys = np.repeat(values, 2)[:-1]  # (2n - 1,)
    return np.column_stack([xs, ys])


def stacked_step_polygons(times: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """One closed outline per layer of `layers` (n, k) stacked in column order over `times` (n,):
    the top step path forwards, then the bottom one backwards. Returns (k, 4n - 2, 2)."""
    top = np.cumsum(layers, axis=1)  # (n, k)
    bottom = top - layers  # (n, k)
    return np.stack([np.concatenate([step_path(times, top[:, j]),
                                     step_path(times, bottom[:, j])[::-1]])
                     for j in range(layers.shape[1])])
