"""The run report's sections on sharded data parallelism and activation offload: per unit, the
FSDP all-gather and reduction seconds and the share the compute waited for; the host memory
activation offload holds (training/data_parallel/fsdp.py, training/pipeline/offload.py; docs/fsdp.md)."""

from simsp.units import format_bytes, format_seconds


def _seconds(t: float) -> str:
    """A duration as the report writes it; "0" for none."""
    return format_seconds(t) if t else "0"


def fsdp_lines(m: dict) -> list[str]:
    """`## Sharded data parallelism`: one row per unit of every stage; none without FSDP."""
    fsdp = m.get("fsdp")
    if not fsdp:
        return []
    lines = ["## Sharded data parallelism", "",
             f"Strategy {fsdp['strategy']}: gathers and reductions take "
             f"{_seconds(fsdp['comm_s'])} on the links, of which {_seconds(fsdp['exposed_s'])} "
             f"({fsdp['exposed_fraction'] * 100:.1f}%) is exposed (the compute waited).", "",
             "| stage | unit | all-gathers | all-gather s | exposed | reductions | reduce s | "
             "exposed | exposed share |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for stage, units in enumerate(fsdp["units_per_stage"]):
        for name, u in units.items():
            lines.append(f"| {stage} | {name} | {u['all_gathers']} | "
                         f"{_seconds(u['all_gather_s'])} | {_seconds(u['all_gather_exposed_s'])} | "
                         f"{u['reductions']} | {_seconds(u['reduce_s'])} | "
                         f"{_seconds(u['reduce_exposed_s'])} | "
                         f"{u['exposed_fraction'] * 100:.1f}% |")
    return lines + [""]


def offload_lines(m: dict) -> list[str]:
    """`## Activation offload`: host memory and copy times per stage; none without it."""
    offload = m.get("offload")
    if not offload:
        return []
    lines = ["## Activation offload", "",
             f"The saved activations of {offload['layers']} layer(s) per stage go to host memory "
             f"over a {offload['host_link_GBps']:g} GB/s host link and back before backward.", "",
             "| stage | offloaded | host memory peak | to host | back | compute waited |",
             "|---|---:|---:|---:|---:|---:|"]
    for stage, s in enumerate(offload["per_stage"]):
        lines.append(f"| {stage} | {format_bytes(s['offloaded_bytes'])} | "
                     f"{format_bytes(s['host_peak_bytes'])} | {_seconds(s['d2h_s'])} | "
                     f"{_seconds(s['h2d_s'])} | {_seconds(s['exposed_s'])} |")
    return lines + [""]
