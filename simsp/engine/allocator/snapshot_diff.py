"""A real memory snapshot against simsp's for the same rank: the differences at each one's
allocated peak and over the iteration, per category, per layer, allocated and reserved, and
the snapshot's allocations simsp does not explain
(docs/allocator.md#comparing-a-real-snapshot-simsp-memory-diff).

Every difference is the snapshot's bytes less simsp's. An allocation alive at the snapshot's
peak is explained when simsp's peak holds one of the same category, layer and size (matched one
to one; one naming no layer, by category and size); the rest are listed, largest first. A real
snapshot's frames say where a tensor was made, never that a deferred W step keeps it, so what
is left of both sides then pairs across simsp's held_for_wgrad: one held_for_wgrad with one of
the categories B moves into it (model/base/wgrad_store.py), of the same size and layer.
"""

from collections import Counter

from simsp.engine.allocator.frame_categories import DIFF_CATEGORIES
from simsp.engine.allocator.snapshot_profile import Profile
from simsp.engine.memory import HELD_FOR_WGRAD

MAX_UNEXPLAINED = 20  # allocations listed
NO_LAYER = "no layer"
HELD_FROM = frozenset(("activations", "temporaries", "communication"))  # what B hands to W


def _bytes_by(alive: list, key) -> dict:
    """Bytes of the allocations grouped by key(allocation)."""
    totals: dict = {}
    for item in alive:
        totals[key(item)] = totals.get(key(item), 0) + item.nbytes
    return totals


def _row(name: str, snapshot: int, simsp: int) -> dict:
    """One compared quantity: both sides' bytes and their difference."""
    return {"name": name, "snapshot_bytes": snapshot, "simsp_bytes": simsp,
            "difference_bytes": snapshot - simsp}


def category_rows(snapshot: Profile, simsp: Profile) -> list[dict]:
    """Per category: the bytes alive at each one's allocated peak and each category's own peak
    over the iteration, with their differences; categories neither side holds are left out."""
    at_real = _bytes_by(snapshot.at_peak, lambda a: a.category)
    at_simsp = _bytes_by(simsp.at_peak, lambda a: a.category)
    rows = []
    for category in DIFF_CATEGORIES:
        row = _row(category, at_real.get(category, 0), at_simsp.get(category, 0))
        over = _row(category, snapshot.category_peaks[category], simsp.category_peaks[category])
        if row["snapshot_bytes"] or row["simsp_bytes"] or over["snapshot_bytes"] \
                or over["simsp_bytes"]:
            rows.append({**row, "own_peak": {k: over[k] for k in over if k != "name"}})
    return rows


def _layer_key(allocation) -> int | str:
    """The allocation's layer, or NO_LAYER."""
    return NO_LAYER if allocation.layer is None else allocation.layer


def layer_rows(snapshot: Profile, simsp: Profile) -> list[dict]:
    """Per layer (then what names none), the bytes alive at each one's allocated peak."""
    real, own = _bytes_by(snapshot.at_peak, _layer_key), _bytes_by(simsp.at_peak, _layer_key)
    layers = sorted(k for k in set(real) | set(own) if k != NO_LAYER)
    names = [*layers, *([NO_LAYER] if NO_LAYER in real or NO_LAYER in own else [])]
    return [_row(f"layer {k}" if k != NO_LAYER else k, real.get(k, 0), own.get(k, 0))
            for k in names]


def unmatched(alive: list, others: list) -> list:
    """The allocations of `alive` with no counterpart in `others`, in `alive`'s order: matched
    one to one by category, layer and size first, then one that names no layer (a real
    snapshot's frames rarely do) by category and size alone."""
    exact = Counter((a.category, a.layer, a.nbytes) for a in others)
    left = []
    for item in alive:
        key = (item.category, item.layer, item.nbytes)
        if exact[key]:
            exact[key] -= 1
        else:
            left.append(item)
    return _unmatched_loosely(left, exact)


def _unmatched_loosely(left: list, exact: Counter) -> list:
    """Of `left`, those no remaining counterpart (`exact`: (category, layer, size) -> count)
    matches by category and size where one of the two names no layer."""
    anywhere, layerless = Counter(), Counter()
    for (category, layer, nbytes), count in exact.items():
        anywhere[category, nbytes] += count
        layerless[category, nbytes] += count if layer is None else 0
    still = []
    for item in left:
        key = (item.category, item.nbytes)
        if item.layer is None and anywhere[key]:
            anywhere[key] -= 1
            layerless[key] -= 1 if anywhere[key] < layerless[key] else 0  # layered ones first
        elif item.layer is not None and layerless[key]:
            layerless[key] -= 1
            anywhere[key] -= 1
        else:
            still.append(item)
    return still


def _may_pair(a, b) -> bool:
    """Whether `a` and `b` may be one tensor seen from both sides: one held_for_wgrad, the
    other a category B moves into it, the same layer or either naming none."""
    categories = {a.category, b.category}
    return HELD_FOR_WGRAD in categories and bool(categories & HELD_FROM) and \
        (a.layer is None or b.layer is None or a.layer == b.layer)


def paired_across_held(extra: list, missing: list) -> tuple[list, list]:
    """What stays unmatched of each side's leftovers (`extra`: the snapshot's, `missing`:
    simsp's) once they pair one to one across held_for_wgrad (_may_pair, same size), in order."""
    candidates: dict = {}  # nbytes -> [index into missing], in order
    for index, item in enumerate(missing):
        if item.category == HELD_FOR_WGRAD or item.category in HELD_FROM:
            candidates.setdefault(item.nbytes, []).append(index)
    paired, still = set(), []
    for item in extra:
        same_size = candidates.get(item.nbytes, [])
        match = next((i for i in same_size if _may_pair(item, missing[i])), None)
        if match is None:
            still.append(item)
        else:
            same_size.remove(match)
            paired.add(match)
    return still, [item for index, item in enumerate(missing) if index not in paired]


def memory_diff(snapshot: Profile, simsp: Profile) -> dict:
    """The whole comparison, JSON-ready."""
    extra, missing = paired_across_held(unmatched(snapshot.at_peak, simsp.at_peak),
                                        unmatched(simsp.at_peak, snapshot.at_peak))
    return {"peaks": [_row("allocated", snapshot.allocated_peak, simsp.allocated_peak),
                      _row("reserved", snapshot.reserved_peak, simsp.reserved_peak)],
            "categories": category_rows(snapshot, simsp),
            "layers": layer_rows(snapshot, simsp),
            "unexplained": [{"bytes": a.nbytes, "category": a.category, "layer": a.layer,
                             "site": a.site} for a in extra[:MAX_UNEXPLAINED]],
            "unexplained_count": len(extra),
            "unexplained_bytes": sum(a.nbytes for a in extra),
            "missing_count": len(missing),
            "missing_bytes": sum(a.nbytes for a in missing),
            "timeline": {"snapshot": snapshot.timeline, "simsp": simsp.timeline}}
