"""The figure machinery every report figure is drawn with: blank figures on the Agg canvas and
their PNG bytes, display units, and the stand-ins for matplotlib calls that cost more than the
rest of a large figure (small multiples in one Axes, stacked step areas as polygons, exact
pixel coverage of many intervals, a pixel-exact image blit, stage tick labels).

Each stand-in exists for speed (docs/PERFORMANCE.md#reports-formatting-a-column-at-a-time) and
has its geometry checked in tests/test_figure_geometry.py, tests/test_pixel_image.py and
tests/test_stage_ticks.py.
"""

import functools
import io
from dataclasses import dataclass

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


# ---------------------------------------------------------------------------------------------
# Pixel coverage of intervals
# ---------------------------------------------------------------------------------------------
#
# How much of each pixel column a set of time intervals covers, with numpy: what an exact
# (area-weighted) rasteriser would paint, at a cost that does not grow with bars per pixel.
#
# Intervals are (n, 2) arrays of [start, end]; pixel columns are given by their n + 1 edges.

def union(intervals: np.ndarray) -> np.ndarray:
    """(m, 2): the disjoint, sorted union of `intervals` (n, 2); touching ones merge."""
    spans = intervals[intervals[:, 1] > intervals[:, 0]]  # (k, 2) non-empty only
    if not len(spans):
        return np.zeros((0, 2))
    spans = spans[np.argsort(spans[:, 0], kind="stable")]
    reach = np.maximum.accumulate(spans[:, 1])  # (k,) furthest end so far
    new = np.r_[True, spans[1:, 0] > reach[:-1]]  # (k,) starts a new group
    first = np.flatnonzero(new)  # (m,)
    last = np.r_[first[1:] - 1, len(spans) - 1]  # (m,)
    return np.column_stack([spans[first, 0], reach[last]])


def covered_up_to(disjoint: np.ndarray, points: np.ndarray) -> np.ndarray:
    """(p,): length of `disjoint` (m, 2, sorted, non-overlapping) that lies before each point."""
    if not len(disjoint):
        return np.zeros(len(points))
    lengths = disjoint[:, 1] - disjoint[:, 0]  # (m,)
    before = np.cumsum(lengths) - lengths  # (m,) covered before each interval starts
    xp = disjoint.reshape(-1)  # (2m,) start0, end0, start1, ...
    fp = np.column_stack([before, before + lengths]).reshape(-1)  # (2m,)
    return np.interp(points, xp, fp)


def pixel_coverage(intervals: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(w,): the fraction of each pixel column (between consecutive `edges`, (w + 1,)) that the
    union of `intervals` covers."""
    covered = covered_up_to(union(intervals), edges)  # (w + 1,)
    return np.diff(covered) / np.diff(edges)


def painted_shares(layers: list[np.ndarray], edges: np.ndarray) -> np.ndarray:
    """(k, w): the share of each pixel column each layer shows when the k layers (each (n, 2)
    intervals) are painted in order, later ones on top; the shares of a column sum to <= 1."""
    shares, above = [], np.zeros((0, 2))
    hidden = np.zeros(len(edges) - 1)  # (w,) covered by the layers above
    for layer in reversed(layers):
        above = np.vstack([above, layer])
        seen = pixel_coverage(above, edges)  # (w,)
        shares.append(np.clip(seen - hidden, 0.0, 1.0))
        hidden = seen
    return np.array(shares[::-1]).reshape(len(layers), len(edges) - 1)


# ---------------------------------------------------------------------------------------------
# Pixel-exact images
# ---------------------------------------------------------------------------------------------
#
# An image already at display resolution drawn into an Axes as it is: one pixel per display
# pixel, handed to the renderer's draw_image (the blit imshow ends in) without imshow's
# resampling, colour mapping and masking, which cost more than the rest of a large figure.

def draw_pixels(ax, rgb: np.ndarray) -> None:
    """Fill `ax`'s frame with `rgb` (h, w, 3) uint8, row 0 at the top: h and w are the frame's
    height and width in display pixels, rounded (the same pixels as imshow with
    interpolation="none" would give)."""
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 255, dtype=np.uint8)])  # (h, w, 4)
    pixels = _pixels_class()(rgba[::-1].copy())  # the renderer's rows go bottom up
    pixels.set_zorder(0)  # below the other artists, as an image's
    ax.add_artist(pixels)


@functools.cache
def _pixels_class():
    """The Artist class (made on first use: matplotlib is imported only to draw)."""
    from matplotlib.artist import Artist

    class Pixels(Artist):
        """RGBA pixels (h, w, 4) uint8, bottom row first, blitted at the Axes' lower left."""

        def __init__(self, rgba: np.ndarray):
            super().__init__()
            self.rgba = rgba

        def draw(self, renderer) -> None:
            """Blit the pixels at the Axes' lower-left corner, clipped to its frame."""
            bbox = self.axes.bbox
            gc = renderer.new_gc()
            gc.set_clip_rectangle(bbox)
            renderer.draw_image(gc, round(bbox.x0), round(bbox.y0), self.rgba)
            gc.restore()

    return Pixels


# ---------------------------------------------------------------------------------------------
# Small multiples in one Axes
# ---------------------------------------------------------------------------------------------
#
# Small multiples drawn into one Axes whose data coordinates are inches on the figure.
#
# Every panel shares the same x and y range, so one set of artists serves them all: one collection
# per layer, one for the frames, one for the grid lines, and text only where a reader needs it
# (titles, tick labels on the outer panels). A real Axes per panel costs tens of milliseconds each
# (ticks, spines, layout); this costs a few milliseconds per panel.

TICK_IN = 3.5 / 72  # matplotlib's default major tick length, 3.5 points
GRID = {"colors": "#b0b0b0", "linewidths": 0.8, "alpha": 0.3, "zorder": 1.5}


@dataclass(frozen=True)
class PanelGrid:
    """`panels` frames in rows of `cols`; sizes in inches (the figure is width x height)."""

    panels: int
    cols: int
    width: float = 13.0
    row_pitch: float = 1.9  # a panel plus its title
    left: float = 0.75
    right: float = 0.15
    top: float = 0.8
    bottom: float = 0.55
    hgap: float = 0.3
    title_gap: float = 0.42

    @property
    def rows(self) -> int:
        """Rows of panels (the last may be partial)."""
        return -(-self.panels // self.cols)

    @property
    def height(self) -> float:
        """The figure's height in inches."""
        return self.top + self.rows * self.row_pitch + self.bottom

    @property
    def panel_size(self) -> tuple[float, float]:
        """(width, height) of one panel's frame in inches."""
        width = (self.width - self.left - self.right - (self.cols - 1) * self.hgap) / self.cols
        return width, self.row_pitch - self.title_gap

    def origins(self) -> np.ndarray:
        """(panels, 2): lower-left corner of each panel's frame, row by row from the top."""
        index = np.arange(self.panels)  # (panels,)
        row, col = np.divmod(index, self.cols)
        width, height = self.panel_size
        x = self.left + col * (width + self.hgap)
        y = self.height - self.top - self.title_gap - height - row * self.row_pitch
        return np.column_stack([x, y]).astype(float)

    def is_bottom(self) -> np.ndarray:
        """(panels,) bool: the lowest panel of its column (it carries the x tick labels)."""
        return np.arange(self.panels) + self.cols >= self.panels

    def place(self, x: np.ndarray, y: np.ndarray, panel: int) -> np.ndarray:
        """Panel-relative (x, y) in [0, 1] -> figure inches, (n, 2)."""
        (x0, y0), (width, height) = self.origins()[panel], self.panel_size
        return np.column_stack([x0 + x * width, y0 + y * height])


def new_sheet(fig, grid: PanelGrid):
    """The one Axes covering the figure, in inches, with no axis of its own."""
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, grid.width)
    ax.set_ylim(0, grid.height)
    ax.set_axis_off()
    return ax


def frames(grid: PanelGrid) -> np.ndarray:
    """(panels, 4, 2): each panel's frame rectangle in inches."""
    width, height = grid.panel_size
    corners = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=float)  # (4, 2)
    return grid.origins()[:, None, :] + corners[None, :, :]


def grid_segments(grid: PanelGrid, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """(panels * (len(xs) + len(ys)), 2, 2): vertical lines at relative `xs` and horizontal ones
    at relative `ys` (each in [0, 1]) across every panel."""
    width, height = grid.panel_size
    vertical = [[[x * width, 0], [x * width, height]] for x in xs]
    horizontal = [[[0, y * height], [width, y * height]] for y in ys]
    lines = np.array(vertical + horizontal, dtype=float).reshape(-1, 2, 2)  # (lines, 2, 2)
    return (grid.origins()[:, None, None, :] + lines[None]).reshape(-1, 2, 2)


def tick_segments(grid: PanelGrid, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """(panels * (len(xs) + len(ys)), 2, 2): outward tick marks on every panel's bottom and left
    edges at relative `xs` and `ys`."""
    width, height = grid.panel_size
    below = [[[x * width, 0], [x * width, -TICK_IN]] for x in xs]
    beside = [[[0, y * height], [-TICK_IN, y * height]] for y in ys]
    marks = np.array(below + beside, dtype=float).reshape(-1, 2, 2)  # (marks, 2, 2)
    return (grid.origins()[:, None, None, :] + marks[None]).reshape(-1, 2, 2)


def nice_ticks(top: float, bins: int) -> np.ndarray:
    """Tick values from 0 to `top` as matplotlib's default locator picks them, (n,)."""
    from matplotlib.ticker import MaxNLocator
    values = MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]).tick_values(0.0, top)
    return values[(values >= 0) & (values <= top * (1 + 1e-9))]


def tick_labels(values: np.ndarray) -> list[str]:
    """Tick values as text with the fewest decimals that show them all exactly."""
    decimals = next((d for d in range(6) if np.allclose(values, np.round(values, d))), 6)
    return [f"{v:.{decimals}f}" for v in values]


def label_axes(ax, grid: PanelGrid, x_ticks: tuple, y_ticks: tuple, names: tuple) -> None:
    """Tick labels and axis names on the outer panels: y on the first column, x under the lowest
    panel of each column. `x_ticks`, `y_ticks`: (relative positions, labels); `names`: (x, y)."""
    origins, (width, height) = grid.origins(), grid.panel_size
    pad = TICK_IN + 0.05
    for (x0, y0), bottom, first in zip(origins, grid.is_bottom(),
                                       np.arange(grid.panels) % grid.cols == 0):
        if first:
            for y, text in zip(*y_ticks):
                ax.text(x0 - pad, y0 + y * height, text, ha="right", va="center", fontsize=9)
            ax.text(x0 - 0.5, y0 + height / 2, names[1], rotation=90, ha="center",
                    va="center", fontsize=10)
        if bottom:
            for x, text in zip(*x_ticks):
                ax.text(x0 + x * width, y0 - pad, text, ha="center", va="top", fontsize=9)
            ax.text(x0 + width / 2, y0 - 0.3, names[0], ha="center", va="top", fontsize=10)


def panel_titles(ax, grid: PanelGrid, titles: list[tuple[str, str]]) -> None:
    """A title (text, colour) centred above each panel's frame."""
    width, height = grid.panel_size
    for (x0, y0), (text, color) in zip(grid.origins(), titles):
        ax.text(x0 + width / 2, y0 + height + 0.06, text, ha="center", va="bottom", fontsize=9,
                color=color)


# ---------------------------------------------------------------------------------------------
# Stage tick labels
# ---------------------------------------------------------------------------------------------
#
# Category ticks (one per pipeline stage) drawn as matplotlib draws ticks, without its Tick
# objects: one Line2D of tick markers and a Text per label.
#
# A matplotlib Tick is five artists (two marks, two labels, a grid line) made with their full
# property machinery, about a millisecond each; a 35-stage chart asked for 35 of them per axis.
# Here the marks are the same markers (TICKLEFT / TICKDOWN, rcParams' major size and width) and
# the labels the same texts at the same offset (size + pad), so the chart looks as before.

STAGE_AXES = ("x", "y")


def stage_ticks(ax, axis: str, labels: list[str], title: str | None = None) -> None:
    """Ticks at 0, 1, ... on `axis` ("x" or "y") of `ax`, labelled `labels`; `title` is the
    axis label, set below the tick labels as matplotlib places it (their height plus its
    label pad)."""
    import matplotlib as mpl
    from matplotlib import lines
    from matplotlib.transforms import ScaledTranslation
    if axis not in STAGE_AXES:
        raise ValueError(f"axis must be one of {STAGE_AXES}, got {axis!r}")
    style = {key: mpl.rcParams[f"{axis}tick.{key}"]
             for key in ("major.size", "major.width", "major.pad", "labelsize", "color")}
    (ax.set_xticks if axis == "x" else ax.set_yticks)([])
    along = range(len(labels))
    points = style["major.size"] + style["major.pad"]  # label offset from the axis line
    if axis == "x":
        transform, marker = ax.get_xaxis_transform(), lines.TICKDOWN
        at, offset, align = (list(along), [0] * len(labels)), (0, -points), ("center", "top")
    else:
        transform, marker = ax.get_yaxis_transform(), lines.TICKLEFT
        at, offset = ([0] * len(labels), list(along)), (-points, 0)
        align = ("right", "center_baseline")
    ax.add_line(lines.Line2D(*at, transform=transform, marker=marker, linestyle="none",
                             markersize=style["major.size"], color=style["color"],
                             markeredgewidth=style["major.width"], clip_on=False))
    shift = transform + ScaledTranslation(offset[0] / 72, offset[1] / 72,
                                          ax.figure.dpi_scale_trans)
    texts = [ax.text(x, y, label, transform=shift, ha=align[0], va=align[1], clip_on=False,
                     fontsize=style["labelsize"], color=style["color"])
             for x, y, label in zip(*at, labels)]
    if title is not None:
        extent = _extent_points(texts[0] if texts else None, axis)
        pad = mpl.rcParams["axes.labelpad"] + points + extent
        (ax.set_xlabel if axis == "x" else ax.set_ylabel)(title, labelpad=pad)


def _extent_points(text, axis: str) -> float:
    """Height (x axis) of a tick label's text in points, as matplotlib measures its box; 0 if
    there is none. (A y axis title would need the widest label: not used.)"""
    from matplotlib.textpath import TextToPath
    if text is None:
        return 0.0
    measure = TextToPath().get_text_width_height_descent
    width, height, _ = measure(text.get_text(), text.get_fontproperties(), ismath=False)
    _, line, _ = measure("lp", text.get_fontproperties(), ismath=False)  # a line's least height
    return max(height, line) if axis == "x" else width
