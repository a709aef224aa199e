"""The ring attention lesson as text: `simsp ring --collective ring_attention`'s step table and
its --explain lines (the split, every step's holdings, sends and times, the balance)."""

from simsp.report.lessons.ring import microseconds
from simsp.report.lessons.ring_attention import DIAGONAL, hidden_sentence, lesson_title
from simsp.units import format_bytes


def _ascii(text: str) -> str:
    """The terminal's spelling of the page's symbols."""
    return (text.replace("µs", "us").replace("÷", "/").replace("×", "x").replace("·", "*")
            .replace("−", "-"))


def _block_names(blocks: list) -> str:
    """'q0.k0 (triangle), q7.k0' for a rank's blocks of one step."""
    return ", ".join(f"q{q}.k{k}" + (" (triangle)" if kind == DIAGONAL else "")
                     for q, k, kind, _r in blocks)


def lesson_text(data: dict) -> list[str]:
    """The split, then every step: what each rank holds and computes, what it sends, the send's
    and the block's times derived, and what the compute hides; then the balance."""
    cp, c = data["cp"], data["chunk_tokens"]
    lines = [f"ring attention over cp = {cp} ranks (GPUs {', '.join(map(str, data['gpus']))}): "
             f"s = {data['seq_length']} tokens in {data['chunks']} chunks of {c}; rank r holds "
             f"chunks r and {2 * cp - 1}-r (Megatron-LM's causal load balancing)",
             f"per TP rank: {data['heads']} query heads, {data['kv_heads']} K/V heads, d = "
             f"{data['head_dim']}, b = {data['micro_batch']}; one rank's K/V block = 2 x b x "
             f"{data['kv_heads']} x {data['seq_length'] // cp} tokens x {data['head_dim']} x 2 B"
             f" = {format_bytes(data['kv_bytes'])}"]
    lines += [f"  rank {r}: chunks {a}, {b} (tokens [{a * c}, {(a + 1) * c}) and "
              f"[{b * c}, {(b + 1) * c}))" for r, (a, b) in enumerate(data["owned"])]
    for step in data["steps"]:
        lines += _step_text(data, step)
    return lines + [_ascii(line) for line in balance_sentences(data)]


def _step_text(data: dict, step: dict) -> list[str]:
    """One step's lines."""
    cp = data["cp"]
    lines = [f"{step['phase']} step {step['index'] + 1}/{cp}: block attention "
             + _ascii(step["compute"]["formula"])]
    for r in range(cp):
        mine = [b for b in step["blocks"] if b[3] == r]
        send = ""
        if step["sends"]:
            send = f"; sends {step['carried'][r]} to rank {step['sends'][r][1]}"
        lines.append(f"  rank {r}: holds the K/V of rank {step['held'][r]}, computes "
                     f"{_block_names(mine)}{send}")
    if step["transfer"]:
        hop = step["transfer"]
        lines.append(f"  send {format_bytes(step['bytes_per_rank'])} per rank, slowest "
                     f"gpu{hop['src']} -> gpu{hop['dst']} ({hop['link']}): "
                     + _ascii(hop["formula"]))
    lines.append(f"  {_ascii(hidden_sentence(step))}")
    return lines


def balance_sentences(data: dict) -> list[str]:
    """Why the 2·cp split: the busiest rank's causal pairs, plain against balanced."""
    balance, cp = data["balance"], data["cp"]
    plain, mine = balance["plain_pairs"], balance["balanced_pairs"]
    return [f"balance: causal attention over s = {data['seq_length']} has "
            f"{balance['causal_pairs']:,} (query, key) pairs; cut into {cp} plain pieces, rank r "
            f"computes {', '.join(f'{p:,}' for p in plain)} (the last rank "
            f"{plain[-1] / plain[0]:.1f}× "
            f"the first, and every step waits for the busiest); cut into 2·cp = {2 * cp} chunks, "
            f"each rank computes {', '.join(f'{p:,}' for p in mine)}: the same work, "
            f"{max(plain) / max(mine):.2f}× less for the busiest rank",
            f"modelled: forward and backward of one layer's attention take "
            f"{microseconds(data['end_s'])}"]


def step_table(data: dict) -> list[str]:
    """`simsp ring --collective ring_attention`'s table: per step, bytes each rank sends, the
    send's and the block's modelled times, and the wait."""
    lines = [f"# {_ascii(lesson_title(data))}, K/V block {format_bytes(data['kv_bytes'])}",
             f"# {'step':>14}  {'sends':>12}  {'bytes':>10}  {'send (us)':>10}  "
             f"{'block (us)':>10}  {'wait (us)':>9}"]
    for step in data["steps"]:
        name = f"{step['phase']} {step['index'] + 1}/{data['cp']}"
        lines.append(f"  {name:>14}  {step['moves'] or '-':>12}  {step['bytes_per_rank']:>10}  "
                     f"{step['transfer_s'] * 1e6:>10.2f}  {step['compute']['time_s'] * 1e6:>10.2f}"
                     f"  {step['exposed_s'] * 1e6:>9.2f}")
    lines.append(f"# forward + backward: {data['end_s'] * 1e6:.2f} us")
    return lines
