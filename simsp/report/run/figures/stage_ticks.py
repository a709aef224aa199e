"""Category tick labels (one per pipeline stage) drawn as matplotlib draws ticks, without its Tick
objects: one Line2D of tick markers and a Text per label."""

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
