"""Pixels of the schedule figure: how much of each pixel column a set of intervals covers (an
exact, area-weighted rasteriser's shares, with numpy) and an image blitted a pixel per display
pixel."""

import functools

import numpy as np


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
