"""The scenario field table: one row per field of every section (table/row.py says what a row
holds). The section dataclasses (scenario/config.py), the flags (scenario/flags.py) and the
per-field limits (scenario/limits.py) are all made from these rows: a new setting is one row in
its section's module here, plus a check in scenario/checks/ if it has a cross-field rule.

A section's rows are in the order of its dataclass's fields; `--help` keeps its own order
(scenario/flags.py HELP_ORDER).
"""

from simsp.scenario.table.cluster import CLUSTER, RUN
from simsp.scenario.table.model import MODEL
from simsp.scenario.table.parallel import PARALLEL

SECTION_ROWS = {"model": MODEL, "parallel": PARALLEL, "cluster": CLUSTER, "run": RUN}
FIELDS = MODEL + PARALLEL + CLUSTER + RUN
