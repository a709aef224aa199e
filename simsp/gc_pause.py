"""Pause Python's cyclic garbage collector around a simulation (docs/PERFORMANCE.md).

A paper-scale iteration creates hundreds of thousands of short-lived simpy events and
generators; the collector would rescan every long-lived object (ledgers, spans) again and again.
Reference counting still frees everything acyclic; the collector resumes afterwards.
"""

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused(freeze: bool = False):
    """Disable the cyclic collector inside the block; restore its previous state on any exit.

    `freeze`: first move every object alive to the collector's permanent generation
    (gc.freeze), for a process that keeps them until it exits (the command line): re-enabling
    would otherwise rescan the whole simulation at the next collection."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()
