"""The ring lesson as one self-contained teaching page: ranks around a ring, chunks as coloured
cells of a rank x chunk grid, stepping through the collective (buttons, autoplay, and the keys a
keyboard or a presenter's clicker sends), each step's time derived from its slowest hop; every
step in one table; all-reduce vs reduce-scatter + all-gather; on several nodes how channels,
rails and PXN carry the ring, on one node how Megatron's sequence parallelism uses the pair
(K22 §4.2.2). Inline CSS and JS, no network. The numbers all come from the lesson model
(report/lessons/ring.py)."""

import html
import json
from pathlib import Path

from simsp.engine.collectives.ring_plan import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from simsp.io_out import write_file
from simsp.report.html import page
from simsp.report.lessons.ring import (NAMES, call_note, call_times, channel_words, hop_path,
                                       lesson_title, microseconds)
from simsp.report.lessons.ring_page_script import SCRIPT
from simsp.units import format_bytes

STYLE = """
.lesson{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start}
#ring{flex:0 0 420px}#grid-box{flex:1 1 480px}
.controls{margin:10px 0;display:flex;gap:8px;align-items:center;flex-wrap:wrap}
.controls button{font-size:15px;padding:5px 14px;border:1px solid #b8c0cc;border-radius:6px;
 background:#f4f6f9;cursor:pointer}.controls button:hover{background:#e6eaf0}
#step-label{font-weight:600;font-size:17px}#step-info{color:#333;margin:4px 0 10px}
table.grid td{width:30px;height:26px;text-align:center;font-size:11.5px;padding:0;
 border:1px solid #d0d5dd}table.grid th{font-size:12px;padding:2px 5px}
table.grid td.empty{background:#fff;color:#bbb}table.grid td.recv{outline:3px solid #111;
 outline-offset:-3px}
table.grid.big td{width:46px;height:36px;font-size:13px}
.steps-box{display:inline-block;border:1px solid #e5e7eb}
.steps-box table{margin:0}
table.steps tr.current{background:#fff3c4 !important}
.panel{background:#fafbfc;border:1px solid #e5e7eb;border-radius:8px;padding:12px 18px;
 margin:16px 0}
.bars{display:grid;grid-template-columns:220px 1fr 110px;gap:6px 12px;align-items:center}
.bar{height:22px;border-radius:3px}.rs{background:#4c72b0}.ag{background:#55a868}
.ar{background:linear-gradient(90deg,#4c72b0 50%,#55a868 50%)}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px -1px 10px}
#step-formula{font-family:monospace;font-size:15px;margin:2px 0 10px;min-height:1.2em}
table.steps td.formula{font-family:monospace;font-size:12px}
.keys kbd{border:1px solid #b8c0cc;border-radius:3px;padding:0 4px;font-size:12px}
"""


SP_DIAGRAM = """<svg width="900" height="120" viewBox="0 0 900 120" role="img"
 aria-label="sequence-parallel region, g all-gather, tensor-parallel region, g-bar
 reduce-scatter, sequence-parallel region">
<defs><marker id="sp-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7"
 markerHeight="7" orient="auto"><path d="M0 0 L10 5 L0 10 z" fill="#333"/></marker></defs>
<rect x="10" y="30" width="190" height="60" rx="8" fill="#dde8f6" stroke="#4c72b0"/>
<text x="105" y="56" text-anchor="middle" font-size="13">LayerNorm, dropout</text>
<text x="105" y="75" text-anchor="middle" font-size="12">SP: s/t of the sequence</text>
<rect x="350" y="30" width="200" height="60" rx="8" fill="#fde9d9" stroke="#c44e52"/>
<text x="450" y="56" text-anchor="middle" font-size="13">attention or MLP</text>
<text x="450" y="75" text-anchor="middle" font-size="12">TP: h/t of the weights</text>
<rect x="700" y="30" width="190" height="60" rx="8" fill="#dde8f6" stroke="#4c72b0"/>
<text x="795" y="56" text-anchor="middle" font-size="13">LayerNorm, dropout</text>
<text x="795" y="75" text-anchor="middle" font-size="12">SP: s/t of the sequence</text>
<line x1="200" y1="60" x2="348" y2="60" stroke="#333" stroke-width="2" marker-end="url(#sp-arrow)"/>
<text x="274" y="50" text-anchor="middle" font-size="14" font-weight="600">g</text>
<text x="274" y="80" text-anchor="middle" font-size="12">all-gather</text>
<line x1="550" y1="60" x2="698" y2="60" stroke="#333" stroke-width="2" marker-end="url(#sp-arrow)"/>
<text x="624" y="50" text-anchor="middle" font-size="14" font-weight="600">ḡ</text>
<text x="624" y="80" text-anchor="middle" font-size="12">reduce-scatter</text>
<text x="450" y="112" text-anchor="middle" font-size="12" fill="#555">forward pass; the
 backward pass swaps them (g: reduce-scatter, ḡ: all-gather)</text></svg>"""


def _step_rows(data: dict) -> str:
    """The table of every step: phase, bytes each rank sends, the slowest hop and its formula,
    cumulative time; all rows visible (no scroll box)."""
    rows, total = [], 0.0
    for i, step in enumerate(data["steps"]):
        total += step["time_s"]
        hop = step["hop"]
        rows.append(f'<tr id="row-{i + 1}"><td>{i + 1}</td><td>{NAMES[step["phase"]]} '
                    f'{step["index"] + 1}</td><td class="num">'
                    f'{format_bytes(step["bytes_per_rank"])}</td><td>{html.escape(hop_path(hop))}'
                    f' <small>({hop["link"]}, ring order {hop["channel"]})</small></td>'
                    f'<td class="formula">{html.escape(hop["formula"])}</td><td class="num">'
                    f'{microseconds(total)}</td></tr>')
    rows.append(f'<tr><td></td><td colspan="4">NCCL\'s base latency, paid once per call '
                f'({data["protocol"]})</td><td class="num">+ {microseconds(data["base_latency_s"])}'
                f'</td></tr><tr><td></td><td colspan="4"><b>one call</b>'
                f' ({html.escape(call_note(data))})</td><td class="num"><b>'
                f'{microseconds(data["call_s"])}</b></td></tr>')
    return ('<div class="steps-box"><table class="steps"><thead><tr><th>step</th><th>phase</th>'
            '<th class="num">sent per rank</th><th>slowest hop</th><th>time = bytes ÷ '
            '(bandwidth × efficiency ÷ sharing × protocol) + latency</th>'
            '<th class="num">cumulative</th>'
            '</tr></thead><tbody>' + "".join(rows) + "</tbody></table></div>")


def _bar(label: str, seconds: float, longest: float, css: str, nbytes: int) -> str:
    """One bar of the comparison: label, width by time, time and bytes per rank."""
    width = 100 * seconds / longest if longest else 0
    return (f"<div>{html.escape(label)}</div><div><div class=\"bar {css}\" "
            f"style=\"width:{width:.1f}%\"></div></div><div class=\"num\">"
            f"{microseconds(seconds)}<br><small>{format_bytes(nbytes)}/rank</small></div>")


def comparison_panel(data: dict) -> str:
    """All-reduce vs reduce-scatter + all-gather: equal bytes, (nearly) equal time."""
    c, n = data["compare"], data["ranks"]
    t = call_times(c)  # whole calls: steps and base latency
    sent = c["bytes_sent_per_rank"]
    pair = t[REDUCE_SCATTER] + t[ALL_GATHER]
    longest = max(t[ALL_REDUCE], pair)
    diff = pair - t[ALL_REDUCE]
    return (
        '<div class="panel" id="compare"><h2>All-reduce = reduce-scatter + all-gather</h2>'
        f"<p>The same S = {format_bytes(data['size_bytes'])} over the same {n}-rank ring. "
        f"The all-reduce is {c['steps'][ALL_REDUCE]} = 2(n−1) steps: the {n - 1} steps of the "
        f"reduce-scatter, then the {n - 1} of the all-gather. Each rank sends 2(n−1)/n·S either "
        "way (NVIDIA/nccl-tests doc/PERFORMANCE.md).</p>"
        '<p class="legend"><span class="rs"></span>reduce-scatter<span class="ag"></span>'
        'all-gather<span class="ar"></span>all-reduce (its two halves)</p><div class="bars">'
        + _bar("all-reduce (one call)", t[ALL_REDUCE], longest, "ar", sent[ALL_REDUCE])
        + _bar("reduce-scatter", t[REDUCE_SCATTER], longest, "rs", sent[REDUCE_SCATTER])
        + _bar("then all-gather", t[ALL_GATHER], longest, "ag", sent[ALL_GATHER])
        + _bar("reduce-scatter + all-gather (two calls)", pair, longest, "ar",
               sent[REDUCE_SCATTER] + sent[ALL_GATHER])
        + "</div>"
        f"<p>Modelled difference: {microseconds(diff)}. Each bar is a whole call: its steps "
        "and NCCL's base latency, its launch and start-up, paid once per call "
        f"({microseconds(c['base_latency_s'][ALL_REDUCE])} for the all-reduce here). simsp runs "
        "the all-reduce as exactly these two phases, so the steps and the bytes agree; two "
        "calls instead of one pay <b>one extra base latency</b>, nothing else. It matters for "
        "small messages only.</p></div>")


def channels_panel(data: dict) -> str:
    """Several nodes: how NCCL's channels, rails and PXN carry the ring, with this page's
    numbers, and why a step here can be faster than on one node."""
    n, nodes, k = data["ranks"], data["nodes"], len(data["channels"])
    chunk, first, one = data["chunk_bytes"][0], data["steps"][0]["hop"], data["one_node"]
    per_node = n // nodes
    channel = data["channels"][0]
    relays = [f"gpu{data['gpus'][channel['order'][p]]} → gpu{v}"
              for p, v in enumerate(channel["via"]) if v is not None]
    return (
        '<div class="panel" id="channels"><h2>Two nodes: channels, rails and PXN</h2>'
        f"<p><b>Channels.</b> NCCL does not run one ring but "
        f"{html.escape(channel_words(data['nccl_channels'], k))}: one ring order per GPU a node "
        f"holds, each its own ring through all {n} GPUs, each carrying 1/{k} of every chunk at "
        f"the same time. A chunk is S/n = {format_bytes(chunk)}, so a ring order moves "
        f"{format_bytes(chunk / k)} per hop. The ring-order selector above shows each ring.</p>"
        f"<p><b>Rails.</b> Every GPU of a DGX node has its own InfiniBand NIC; NIC i of every "
        f"node sits on the same leaf switch, <i>rail</i> i. Channel c enters each node at the "
        f"GPU on rail c and leaves it through rail c's NIC, so the {k} ring orders cross "
        f"between nodes over {k} different NICs at once instead of sharing one.</p>"
        f"<p><b>PXN.</b> The GPU just before a node crossing is not the one on the channel's "
        f"rail. With PXN (NCCL ≥ 2.12) it hands the data over NVLink to the GPU that owns the "
        f"rail's NIC, which sends it across: ring order 0's crossings are "
        f"{html.escape(', '.join(relays))} then out over InfiniBand, drawn on the ring as a "
        f"dotted NVLink leg and a red dashed InfiniBand leg.</p>"
        f"<p><b>Why a step here is faster than on one node.</b> Every step waits for its "
        f"slowest hop. Here that is {html.escape(hop_path(first))} over {first['link']}: "
        f"<code>{html.escape(first['formula'])}</code>. The same S on one node's {per_node} "
        f"GPUs cuts it into {per_node} chunks of {format_bytes(data['size_bytes'] / per_node)} "
        f"on one ring over NVLink: <code>{html.escape(one['formula'])}</code>. Twice the ranks "
        f"halve the chunk, and {k} ring orders on {k} NICs split it again, which outweighs the "
        f"slower InfiniBand link. The 2-node ring still takes 2(n−1) = {2 * (n - 1)} steps "
        f"instead of {2 * (per_node - 1)}.</p></div>")


def sp_panel(data: dict) -> str:
    """One node: Megatron sequence parallelism (K22 §4.2.2), g = all-gather in, g-bar =
    reduce-scatter out; tensor parallelism never spans nodes, so only one-node pages have it."""
    c, size = data["compare"], data["size_bytes"]
    sent = c["bytes_sent_per_rank"]
    return (
        '<div class="panel" id="sp"><h2>Why it matters: Megatron sequence parallelism</h2>'
        "<p>Tensor parallelism without SP wraps each attention and MLP block in <i>f</i> "
        "(identity forward, all-reduce backward) and <i>f̄</i> (all-reduce forward): "
        f"every layer-norm and dropout between blocks runs on the whole s·b·h activation, "
        "replicated on every TP rank.</p><p>With sequence parallelism (K22 §4.2.2) those "
        "regions are split along the sequence. Entering a TP block, <b>g</b> = all-gather "
        "collects the sequence shards into the full activation; leaving it, <b>ḡ</b> = "
        "reduce-scatter sums the partial results and hands each rank its sequence shard back "
        "(and the reverse in the backward pass).</p>"
        f"<p>For an activation of S = {format_bytes(size)} on {data['ranks']} ranks: the "
        f"all-reduce of f̄ sends {format_bytes(sent[ALL_REDUCE])} per rank; g + ḡ send "
        f"{format_bytes(sent[ALL_GATHER])} + {format_bytes(sent[REDUCE_SCATTER])} = "
        f"{format_bytes(sent[ALL_GATHER] + sent[REDUCE_SCATTER])}: the same bytes, because an "
        "all-reduce <i>is</i> a reduce-scatter followed by an all-gather, now split around the "
        "block instead of after it. The communication is free; the activations between blocks "
        "shrink t-fold.</p>" + SP_DIAGRAM + "</div>")


def lesson_html(data: dict, title: str) -> str:
    """The whole page."""
    n, nodes = data["ranks"], data["nodes"]
    intro = (f"<h1>{html.escape(title)}</h1><p class=\"meta\">{n} ranks on {nodes} node(s) of "
             f"{data['gpus_per_node']} GPUs; S = {format_bytes(data['size_bytes'])} split into "
             f"{n} chunks; {html.escape(channel_words(data['nccl_channels'], len(data['channels'])))}; "
             f"one call {microseconds(data['call_s'])}; link calibration "
             f"<code>{html.escape(data['calibration'])}</code>.</p>"
             "<p>Each row of the grid is a rank, each column a chunk of the message. A cell's "
             "colour is its chunk; its shade, how many ranks' data it already sums "
             "(pale: its own only, dark: <b>all</b>). Arrows on the ring show this step's sends; "
             "thick outlined cells just received a chunk. Each step's time is derived below the "
             "step's title: bytes ÷ (bandwidth × efficiency ÷ hops sharing the link × the "
             "share of it NCCL's protocol gets) + latency (× the protocol's factor)."
             "</p><p class=\"keys\">Keys: <kbd>→</kbd> or <kbd>PageDown</kbd> next, <kbd>←"
             "</kbd> or <kbd>PageUp</kbd> back (a presenter's clicker sends these), "
             "<kbd>space</kbd> play/pause, <kbd>Home</kbd> start.</p>")
    lesson = ('<div class="lesson"><div id="ring"></div><div id="grid-box">'
              '<div class="controls"><button id="prev">◀ prev</button><button id="next">next ▶'
              '</button><button id="play">▶ play</button><button id="reset">reset</button>'
              '<span id="channel-box"></span></div><div id="step-label"></div>'
              '<div id="step-info"></div><div id="step-formula"></div><div id="grid"></div>'
              '</div></div>')
    context = channels_panel(data) if nodes > 1 else sp_panel(data)
    body = (intro + lesson + "<h2>Every step</h2>" + _step_rows(data) + comparison_panel(data)
            + context)
    script = f"var DATA = {json.dumps(data, sort_keys=True)};\n{SCRIPT}"
    return page(title, body, STYLE, script)


def write_page(data: dict, path) -> Path:
    """`simsp ring --html FILE`: the page of the lesson `data` (report/lessons/ring.py),
    written to `path`."""
    path = Path(path)
    write_file(path, lesson_html(data, lesson_title(data)))
    return path
