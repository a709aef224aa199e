"""Blank matplotlib figures on the Agg canvas, laid out with fixed margins, and their PNG bytes.

The object-oriented API (Figure + FigureCanvasAgg): no pyplot, no figure manager, no global
state, and matplotlib is imported only when a figure is drawn. Margins are given in inches, so
a figure's layout is a closed form of its size (no tight_layout, which measures every artist).
"""

import io

import numpy as np

DPI = 100  # every report PNG
PNG_OPTIONS = {"compress_level": 3}  # zlib level: about 1.4x faster than 6, files about 1.2x


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
    """The figure as PNG bytes with no varying metadata (the same run gives the same bytes):
    RGB when every pixel is opaque (a quarter less to filter and compress than RGBA)."""
    from PIL import Image  # matplotlib's own PNG writer
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())  # (h, w, 4) uint8
    pixels = rgba[..., :3] if (rgba[..., 3] == 255).all() else rgba  # (h, w, 3 or 4)
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="png", dpi=(DPI, DPI),
                                                      **PNG_OPTIONS)
    return buffer.getvalue()


def warm_up() -> None:
    """Import matplotlib and draw a line of text, so that the first real figure finds the
    modules and fonts loaded (the painter process does this while the simulation runs)."""
    fig = new_figure(1.0, 1.0)
    if fig is not None:
        fig.text(0.1, 0.5, "stage 0: 1.5 GiB")
        png_bytes(fig)
