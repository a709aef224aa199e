"""report/pixel_image.py: an image blitted a pixel per display pixel is exactly what matplotlib's
own imshow (interpolation "none") draws in the same Axes."""

import io

import numpy as np
import pytest
from PIL import Image

from simsp.report.run.figures.drawing import add_axes_in, new_figure
from simsp.report.run.figures.pixels import draw_pixels


def rendered(draw, rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) pixels of a figure whose one Axes shows `rgb` by `draw`."""
    fig = new_figure(3.0, 2.0)
    ax = add_axes_in(fig, 0.5, 0.37, 0.3, 0.2)
    draw(ax, rgb)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return np.asarray(Image.open(buffer).convert("RGB"))


def by_imshow(ax, rgb):
    ax.imshow(rgb, extent=(0, 1, 0, 1), interpolation="none", aspect="auto", origin="upper")


@pytest.mark.parametrize("seed", [0, 1])
def test_the_blit_draws_the_pixels_imshow_draws(seed):
    fig = new_figure(3.0, 2.0)
    ax = add_axes_in(fig, 0.5, 0.37, 0.3, 0.2)
    h, w = int(round(ax.bbox.height)), int(round(ax.bbox.width))
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)  # (h, w, 3)
    blitted = rendered(draw_pixels, rgb)
    assert np.array_equal(blitted, rendered(by_imshow, rgb))
    assert len(np.unique(blitted.reshape(-1, 3), axis=0)) > 1000  # the image is there
