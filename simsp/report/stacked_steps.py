"""Stacked step areas as polygons built with numpy (what stackplot(step="post") draws, without
one fill_between per layer): each layer's area lies between the running sums below and above it,
and every value holds from its time to the next."""

import numpy as np


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
