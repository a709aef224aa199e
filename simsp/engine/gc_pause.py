"""Pause Python's cyclic garbage collector around a simulation (issue 9: cheap events).

A paper-scale iteration creates hundreds of thousands of short-lived simpy events and
generators; the collector would rescan every long-lived object (ledgers, spans) again and again.
Reference counting still frees everything acyclic; the collector resumes afterwards.
"""

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """Disable the cyclic collector inside the block; restore its previous state on any exit."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
