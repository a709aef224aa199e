"""A rank's ledger as the caching allocator's request stream: every tensor the ledger allocates
and frees becomes an Alloc or Free, in the ledger's time order, with its model site
(docs/allocator.md#a-ranks-ledger-through-the-allocator).

The ledger records no stream, so every request is on stream 0, the compute stream Megatron-LM
allocates on. A retag (`Ledger.retag`: a temporary kept for backward becomes an activation, a
tensor renamed) frees and allocates the same tensor in the ledger, but in PyTorch it is one tensor
that never leaves its block: it is one request here, named by its last key and category.
"""

import re

from simsp.errors import SimulationError
from simsp.engine.allocator.config import AllocatorConfig
from simsp.engine.allocator.replay import Alloc, Free, Replay, replay
from simsp.engine.allocator.snapshot import Site

RETAG = "retag"  # the op Ledger.retag records on the free half of a move
COMPUTE_STREAM = 0
_MICRO_BATCH = re.compile(r"mb(\d+)$")  # "mb3": micro-batch 3 (the ledger's key scopes)
_LAYER = re.compile(r"L(\d+)$")  # "L12": layer 12


def site_of(key: str, category: str) -> Site:
    """The model site of a ledger key: its dotted parts, outermost first, with "mbN" read as
    micro-batch N and "LN" or "layers.N" as layer N ("mb1.L6.q" -> micro-batch 1, layer 6, q)."""
    parts, path = key.split("."), []
    for i, part in enumerate(parts):
        if part.isdigit() and i and parts[i - 1] == "layers":
            path[-1] = f"layer {part}"
        elif _MICRO_BATCH.match(part):
            path.append(f"micro-batch {part[2:]}")
        elif _LAYER.match(part):
            path.append(f"layer {part[1:]}")
        else:
            path.append(part)
    return Site(tuple(path), category)


def allocation_events(ledger, with_sites: bool = True) -> list:
    """The ledger's changes in time order (ties in recording order, as its peaks count them) as
    Alloc/Free events with the ledger's times, each request keyed by its Alloc's index and, with
    `with_sites`, its model site as context (a snapshot's frames; the byte counts need none)."""
    site = site_of if with_sites else _no_site
    log, changes = ledger.sorted_log(), ledger.events
    events, live, moving = [], {}, None  # live: ledger key -> index of its Alloc in events
    for position in log.order.tolist():
        change = changes[position]
        if moving is not None:
            _check_retag(moving, change)
            index = live[change.key] = live.pop(moving.key)
            if with_sites:
                events[index] = events[index]._replace(context=site(change.key, change.category))
            moving = None
        elif change.delta_bytes < 0 and change.op == RETAG:
            moving = change
        elif change.delta_bytes < 0:
            events.append(Free(live.pop(change.key), change.time_s))
        else:
            live[change.key] = len(events)
            events.append(Alloc(len(events), change.delta_bytes, COMPUTE_STREAM, change.time_s,
                                site(change.key, change.category)))
    return events


def _no_site(key: str, category: str) -> None:
    """No context: a replay for its byte counts only."""
    return None


def _check_retag(moving, change) -> None:
    """A retag's free must be followed at once by the alloc of the same bytes (Ledger.retag)."""
    if change.delta_bytes != -moving.delta_bytes or change.time_s != moving.time_s:
        raise SimulationError(f"retag of {moving.key!r} not followed by its re-allocation "
                              f"(got {change.key!r}, {change.delta_bytes} B)")


def replay_ledger(ledger, record_trace: bool = False,
                  expandable_segments: bool = False) -> Replay:
    """The rank's allocation stream through PyTorch's caching allocator, its capacity the
    ledger's (the GPU's memory), default settings or `expandable_segments:True`; `record_trace`:
    with the trace and model sites a snapshot shows."""
    config = AllocatorConfig(ledger.capacity_bytes, expandable_segments=expandable_segments)
    return replay(allocation_events(ledger, with_sites=record_trace), config,
                  record_trace=record_trace)
