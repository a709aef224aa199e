"""The ring lesson as text (`simsp ring --explain`): every step's sends, receives and holdings,
its modelled time with the hop that sets it, then the bytes and the AR = RS + AG time line."""

from simsp.engine.collectives.ring_plan import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, STEPS,
                                                bytes_sent_per_rank, chunk_offsets)
from simsp.report.lessons.ring import call_note, call_times, channel_words, hop_path


def lesson_text(data: dict) -> list[str]:
    """Every step of the ring: what each rank sends, receives, reduces and then holds, the step's
    modelled time with the hop that sets it, then the bytes and the AR = RS + AG time line."""
    collective, n = data["collective"], data["ranks"]
    steps = data["steps"]
    lines = _text_intro(data)
    lines += ["start"] + [f"  rank {p}: holds {_holds(row, n)}"
                          for p, row in enumerate(data["start"])]
    for overall, step in enumerate(steps):
        title = f"{step['phase']} step {step['index'] + 1}/{n - 1}"
        if collective == ALL_REDUCE:
            title += f"  (all_reduce step {overall + 1}/{len(steps)})"
        lines.append(title + f"  time {step['time_s'] * 1e6:.3f} us")
        lines.append(f"  slowest hop {_ascii(hop_path(step['hop']))}, ring order "
                     f"{step['hop']['channel']}, {step['hop']['link']}: "
                     f"{_ascii(step['hop']['formula'])}")
        lines += [_rank_line(step, p, n) for p in range(n)]
    return lines + _text_summary(data) + _time_lines(data)


def _ascii(text: str) -> str:
    """The terminal text's spelling of the page's symbols."""
    return text.replace("µs", "us").replace("÷", "/").replace("×", "x").replace("→", "->")


def _text_intro(data: dict) -> list[str]:
    """The message, its chunks and the notation."""
    n, counts = data["ranks"], [b // data["elem_bytes"] for b in data["chunk_bytes"]]
    ring = " -> ".join(str(r) for r in range(n)) + " -> 0"
    chunks = ", ".join(f"c{c} = [{o}, {o + k})" for c, (o, k)
                       in enumerate(zip(chunk_offsets(counts), counts)))
    return [f"{data['collective']} of {data['size_bytes']} B ({sum(counts)} float elements) "
            f"over {n} ranks, ring {ring}",
            f"chunks (elements): {chunks}",
            "notation: cK=a+b: the rank's copy of chunk K holds the sum of ranks a and b's data;"
            " all = summed over every rank; - = not held"]


def _rank_line(step: dict, rank: int, n: int) -> str:
    """One rank at one step: send, receive, reduce or copy, and what it holds afterwards."""
    out = next(s for s in step["sends"] if s[0] == rank)
    into = next(s for s in step["sends"] if s[1] == rank)
    action = "reduce" if step["phase"] == REDUCE_SCATTER else "copy"
    return (f"  rank {rank}: send c{out[2]} to {out[1]}, recv c{into[2]} from {into[0]}, "
            f"{action} c{into[2]} | holds {_holds(step['holdings'][rank], n)}")


def _holds(row, n: int) -> str:
    """A rank's chunks in the cK=a+b notation."""
    def name(contributors) -> str:
        """'-', 'all', or the contributing ranks joined by '+'."""
        if not contributors:
            return "-"
        if len(contributors) == n and n > 1:
            return "all"
        return "+".join(str(r) for r in sorted(contributors))
    return " ".join(f"c{c}={name(who)}" for c, who in enumerate(row))


def _text_summary(data: dict) -> list[str]:
    """Bytes each rank sent, and for all-reduce how it splits into its two phases."""
    collective, n, nbytes = data["collective"], data["ranks"], data["size_bytes"]
    sent = bytes_sent_per_rank(STEPS[collective](n), data["chunk_bytes"])
    if collective != ALL_REDUCE:
        return [f"{n - 1} steps; bytes sent per rank {sent} ((n-1)/n*S = "
                f"{(n - 1) * nbytes / n:g})"]
    first = bytes_sent_per_rank(STEPS[REDUCE_SCATTER](n), data["chunk_bytes"])
    second = bytes_sent_per_rank(STEPS[ALL_GATHER](n), data["chunk_bytes"])
    return [f"all_reduce = reduce_scatter (steps 1-{n - 1}) then all_gather (steps {n}-"
            f"{2 * (n - 1)}): 2(n-1) = {2 * (n - 1)} steps",
            f"bytes sent per rank {sent} = reduce_scatter {first} + all_gather {second} "
            f"(2(n-1)/n*S = {2 * (n - 1) * nbytes / n:g})"]


def _time_lines(data: dict) -> list[str]:
    """Channels, and the all-reduce's time against reduce-scatter + all-gather."""
    compare = data["compare"]
    calls = call_times(compare)
    ar, rs, ag = (calls[c] for c in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER))
    orders = len(data["channels"])
    lines = [f"runs as {channel_words(data['nccl_channels'], orders)}"
             + (f"; each order carries a 1/{orders} slice of every chunk; the plan above is each "
                f"order's in ring positions (its GPU order: the table below); a step's time is "
                f"its slowest order's" if orders > 1 else ""),
             f"one call: the steps {data['steps_s'] * 1e6:.3f} us + NCCL's base latency "
             f"{data['base_latency_s'] * 1e6:.3f} us (once per call, {data['protocol']}) = "
             f"{data['call_s'] * 1e6:.3f} us ({call_note(data)})"]
    lines.append(f"time: all_reduce {ar * 1e6:.3f} us = reduce_scatter {rs * 1e6:.3f} us + "
                 f"all_gather {ag * 1e6:.3f} us ({(rs + ag) * 1e6:.3f} us, difference "
                 f"{(ar - rs - ag) * 1e6:+.3f} us): the same 2(n-1) steps and bytes; each call "
                 f"pays NCCL's base latency once "
                 f"({compare['base_latency_s'][ALL_REDUCE] * 1e6:.3f} us for the all-reduce), "
                 f"so as two calls RS + AG pay it twice")
    return lines

