"""An image already at display resolution drawn into an Axes as it is: one pixel per display
pixel, handed to the renderer's draw_image (the blit imshow ends in) without imshow's
resampling, colour mapping and masking, which cost more than the rest of a large figure."""

import functools

import numpy as np


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
            bbox = self.axes.bbox
            gc = renderer.new_gc()
            gc.set_clip_rectangle(bbox)
            renderer.draw_image(gc, round(bbox.x0), round(bbox.y0), self.rgba)
            gc.restore()

    return Pixels
