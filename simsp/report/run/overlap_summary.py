"""The run report's overlaps section: per pipeline stage, each communication that ran beside
compute, what it ran behind, its seconds on the links, the part the compute waited for
(exposed) and the rest (hidden). docs/overlaps.md.

Read from the metrics the overlaps keep (metrics/sections.py `overlaps_section`, `fsdp_section`): the DP bucket
collectives (training/data_parallel/grad_buckets.py), Transformer Engine's TP methods
(model/base/tp_overlap.py), the FSDP units (training/data_parallel/fsdp.py).
"""

from simsp.units import format_seconds

# metric key -> (what ran, what it ran behind)
DP_KINDS = {
    "all_gather": ("DP parameter all-gather (--overlap-param-gather)",
                   "the forward of the layers before the bucket's"),
    "reduce": ("DP gradient reduction (--overlap-grad-reduce)",
               "the backward of the layers after the bucket's"),
}
TP_METHODS = {
    "ring_exchange": ("TP ring exchange (--tp-comm-overlap)", "the GEMM pieces it feeds"),
    "pipeline": ("TP pipelined reduce-scatter (--tp-comm-overlap)",
                 "the GEMM's later column pieces"),
    "ring_exchange_rs": ("TP ring-exchange reduce-scatter (--tp-comm-overlap)",
                         "the GEMM's later row pieces"),
    "bulk": ("TP bulk collective (--tp-comm-overlap)",
             "the other backward GEMM (dgrad beside wgrad)"),
}
FSDP_KINDS = (("all_gather", "FSDP parameter all-gathers", "the previous unit's compute"),
              ("reduce", "FSDP gradient reductions", "the next unit's backward"))


def _seconds(t: float) -> str:
    """A duration as the report writes it; "0" for none."""
    return format_seconds(t) if t else "0"


def _row(stage: int, what: str, behind: str, comm: float, exposed: float) -> str:
    """One table row: the hidden part is what the compute did not wait for."""
    return (f"| {stage} | {what} | {behind} | {_seconds(comm)} | {_seconds(exposed)} | "
            f"{_seconds(max(comm - exposed, 0.0))} |")


def stage_overlaps(m: dict, stage: int) -> list[str]:
    """The rows of one stage: DP buckets, then TP methods, then FSDP units."""
    rows = []
    for kind, seen in _at(m.get("dp_overlap_per_stage"), stage).items():
        what, behind = DP_KINDS.get(kind, (f"DP {kind}", "compute"))
        rows.append(_row(stage, what, behind, seen["comm_s"], seen["exposed_s"]))
    for method, seen in _at(m.get("tp_overlap_per_stage"), stage).items():
        what, behind = TP_METHODS.get(method, (f"TP {method.replace('_', ' ')}", "its GEMM"))
        rows.append(_row(stage, what, behind, seen["comm_s"], seen["exposed_s"]))
    units = _at((m.get("fsdp") or {}).get("units_per_stage"), stage).values()
    for kind, what, behind in FSDP_KINDS if units else ():
        comm = sum(u[f"{kind}_s"] for u in units)
        exposed = sum(u[f"{kind}_exposed_s"] for u in units)
        rows.append(_row(stage, what, behind, comm, exposed))
    return rows


def _at(per_stage: list | None, stage: int) -> dict:
    """Stage `stage`'s entry of a per-stage list, {} when the list is absent."""
    return per_stage[stage] if per_stage else {}


def overlap_lines(m: dict) -> list[str]:
    """`## Overlaps`: every overlapped communication per stage; none when nothing overlapped."""
    stages = len(m["exposed_s_per_stage"])
    rows = [row for stage in range(stages) for row in stage_overlaps(m, stage)]
    if not rows:
        return []
    return ["## Overlaps: what was hidden, behind what, and what stayed exposed", "",
            "Communication issued beside compute, per stage (rank tp 0, dp 0): its seconds on "
            "the links, the part the compute stream waited for (exposed) and the rest (hidden). "
            "With `--trace full` each transfer in trace.json carries `hidden_s` (the seconds a "
            "kernel of its rank ran meanwhile) and `behind` (the first and last such kernel).",
            "", "| stage | overlap | behind | comm | exposed | hidden |",
            "|---:|---|---|---:|---:|---:|", *rows, ""]
