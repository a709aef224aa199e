"""The ring lesson's data: every step of a ring collective (who sends which chunk, what each rank
then holds), its bytes and modelled time, the channels (NCCL rings) and their link kinds, and the
all-reduce = reduce-scatter + all-gather comparison. Plain JSON-ready dicts; the page
(ring_lesson_page.py) and the slides (ring_lesson_png.py) only draw them.

Steps and holdings come from simsp.engine.ring_plan; times from simsp.engine.ring_timing (every
step at its slowest hop: latency + chunk bytes / achieved rate).
"""

from pathlib import Path

from simsp.cluster.topology import gpu_name, route
from simsp.engine.ring_plan import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, STEPS, apply_step,
                                    bytes_sent_per_rank, chunk_counts, initial_holdings)
from simsp.engine import ring_timing
from simsp.errors import UserError
from simsp.hardware import LinkCalibration
from simsp.io_out import write_file
from simsp.report.ring_lesson_page import lesson_html
from simsp.report.ring_lesson_png import write_slides
from simsp.units import format_bytes

try:  # NCCL channels (several rings, rail by rail across nodes), where the engine has them
    from simsp.engine.ring_plan import channel_rings
except ImportError:  # an engine with one ring: one channel, the ranks in order
    channel_rings = None

MAX_LESSON_RANKS = 16


def lesson_channels(graph, gpus: list[int]) -> list[dict]:
    """[{index, order (ring positions -> member), rail, via}] of the group's channels."""
    if channel_rings is None:
        n = len(gpus)
        return [{"index": 0, "order": list(range(n)), "rail": None, "via": [None] * n}]
    return [{"index": ch.index, "order": list(ch.order), "rail": ch.rail, "via": list(ch.via)}
            for ch in channel_rings(list(gpus), graph.graph["gpus_per_node"])]


def hop_kinds(graph, gpus: list[int], channel: dict) -> list[str]:
    """'NVLink' or 'InfiniBand' for the hop from each ring position to the next."""
    order, n = channel["order"], len(channel["order"])
    kinds = []
    for p in range(n):
        src, dst = gpus[order[p]], gpus[order[(p + 1) % n]]
        edges = route(graph, gpu_name(src), gpu_name(dst))
        kinds.append("InfiniBand" if any(graph.edges[e]["kind"] == "ib" for e in edges)
                     else "NVLink")
    return kinds


def step_times(collective: str, graph, gpus: list[int], nbytes: int, elem_bytes: int,
               calibration: LinkCalibration) -> list[float]:
    """Modelled seconds of every step: the slowest channel's step (channels run concurrently)."""
    if hasattr(ring_timing, "step_times"):
        per_channel = ring_timing.step_times(collective, graph, gpus, nbytes, calibration,
                                             elem_bytes)  # [channel][step]
        return [max(times) for times in zip(*per_channel)]
    hops = ring_timing.ring_hops(graph, gpus, calibration)  # [(latency_s, rate_Bps)] per hop
    chunk_bytes = [c * elem_bytes for c in chunk_counts(nbytes // elem_bytes, len(gpus))]
    return [max(hops[s.src][0] + chunk_bytes[s.chunk] / hops[s.src][1] for s in step.sends)
            for step in STEPS[collective](len(gpus))]


def _holdings(holdings) -> list[list[list[int]]]:
    """Holdings as JSON: [position][chunk] -> sorted contributing positions."""
    return [[sorted(cell) for cell in row] for row in holdings]


def lesson_steps(collective: str, n: int, chunk_bytes: list[int], times: list[float]) -> list:
    """Every step: phase, index, sends [src, dst, chunk], bytes each rank sends, modelled time,
    and what every position holds afterwards."""
    holdings, out = initial_holdings(collective, n), []
    for step, time_s in zip(STEPS[collective](n), times):
        holdings = apply_step(holdings, step)
        out.append({"phase": step.phase, "index": step.index,
                    "sends": [[s.src, s.dst, s.chunk] for s in step.sends],
                    "bytes_per_rank": max(chunk_bytes[s.chunk] for s in step.sends),
                    "time_s": time_s, "holdings": _holdings(holdings)})
    return out


def comparison(graph, gpus: list[int], nbytes: int, elem_bytes: int,
               calibration: LinkCalibration) -> dict:
    """All-reduce against reduce-scatter + all-gather of the same S: bytes per rank and time."""
    n = len(gpus)
    chunk_bytes = [c * elem_bytes for c in chunk_counts(nbytes // elem_bytes, n)]
    times = {c: sum(step_times(c, graph, gpus, nbytes, elem_bytes, calibration))
             for c in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)}
    sent = {c: max(bytes_sent_per_rank(STEPS[c](n), chunk_bytes))
            for c in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)}
    return {"time_s": times, "bytes_sent_per_rank": sent, "steps": {
        ALL_REDUCE: 2 * (n - 1), REDUCE_SCATTER: n - 1, ALL_GATHER: n - 1}}


def lesson_data(collective: str, graph, gpus: list[int], nbytes: int, elem_bytes: int = 4,
                calibration: LinkCalibration | None = None) -> dict:
    """Everything the lesson page and slides show, JSON-ready."""
    calibration = calibration or LinkCalibration()
    n = len(gpus)
    chunk_bytes = [c * elem_bytes for c in chunk_counts(nbytes // elem_bytes, n)]
    times = step_times(collective, graph, gpus, nbytes, elem_bytes, calibration)
    channels = lesson_channels(graph, gpus)
    for channel in channels:
        channel["hops"] = hop_kinds(graph, gpus, channel)
    per_node = graph.graph["gpus_per_node"]
    return {"collective": collective, "ranks": n, "gpus": list(gpus),
            "nodes": len({g // per_node for g in gpus}), "gpus_per_node": per_node,
            "size_bytes": nbytes, "elem_bytes": elem_bytes, "chunk_bytes": chunk_bytes,
            "calibration": calibration.describe(), "channels": channels,
            "start": _holdings(initial_holdings(collective, n)),
            "steps": lesson_steps(collective, n, chunk_bytes, times),
            "compare": comparison(graph, gpus, nbytes, elem_bytes, calibration)}


def lesson_title(data: dict) -> str:
    """'Ring all_reduce of 1.00 MiB over 4 ranks (1 node)'."""
    return (f"Ring {data['collective'].replace('_', '-')} of {format_bytes(data['size_bytes'])}"
            f" over {data['ranks']} ranks ({data['nodes']} node{'s' if data['nodes'] > 1 else ''})")


def write_ring_lesson(collective: str, graph, gpus: list[int], nbytes: int, html_path=None,
                      png_dir=None, calibration: LinkCalibration | None = None) -> list[Path]:
    """`simsp ring --html FILE / --png DIR`: the teaching page and/or the slides."""
    if len(gpus) > MAX_LESSON_RANKS:
        raise UserError("--html" if html_path else "--png", f"the lesson draws every rank and "
                        f"chunk: use at most {MAX_LESSON_RANKS} ranks, got {len(gpus)}")
    data = lesson_data(collective, graph, gpus, nbytes, calibration=calibration)
    written = []
    if html_path:
        path = Path(html_path)
        write_file(path, lesson_html(data, lesson_title(data)))
        written.append(path)
    if png_dir:
        written += write_slides(data, png_dir)
    return written
