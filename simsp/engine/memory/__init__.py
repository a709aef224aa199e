"""Each rank's memory ledger: every tensor allocated and freed by name, category, bytes and time.

Modules, bottom up: op_block (a layer step's ledger changes recorded once and applied many
times), compact_log (its records, their expansion and numpy columns), summary (peaks and the
out-of-memory verdict as pure functions of the log), live_set (what is live now, a replayed
block as one group), and ledger (the Ledger itself and the memory categories). The compact log
and the grouped live set exist for speed
(docs/PERFORMANCE.md#the-ledger-cheap-changes-summaries-in-numpy); expanding the log gives
exactly the per-tensor log and the same figures (tests/test_ledger_compact.py).

The names the rest of simsp uses are importable from here (`from simsp.engine.memory import
Ledger, CATEGORIES`).
"""

from simsp.engine.memory.compact_log import MemEvent, expand, sort_log
from simsp.engine.memory.ledger import CATEGORIES, HELD_FOR_WGRAD, PERSISTENT, Ledger
from simsp.engine.memory.live_set import AlreadyLive
from simsp.engine.memory.op_block import INPUT, OpBlock
from simsp.engine.memory.summary import LiveTensor, MemorySummary, OutOfMemory

__all__ = ["AlreadyLive", "CATEGORIES", "HELD_FOR_WGRAD", "INPUT", "Ledger", "LiveTensor",
           "MemEvent", "MemorySummary", "OpBlock", "OutOfMemory", "PERSISTENT", "expand",
           "sort_log"]
