"""Small multiples drawn into one Axes whose data coordinates are inches on the figure: the panel
grid, its frames, grid lines, ticks, labels and titles."""

from dataclasses import dataclass

import numpy as np


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
