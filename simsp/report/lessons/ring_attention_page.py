"""The ring attention lesson as one self-contained teaching page: the CP ranks on a ring passing
K/V blocks, a (query chunk × key chunk) grid filling in as each rank computes the blocks its
queries see, each step's send and block compute derived side by side, every step in one table,
and why the 2·cp split balances the causal triangle. Buttons, autoplay and the keys a keyboard or
a presenter's clicker sends; inline CSS and JS, no network. The numbers all come from the lesson
model (report/lessons/ring_attention.py)."""

import html
import json
from pathlib import Path

from simsp.io_out import write_file
from simsp.report.html import page
from simsp.report.lessons.ring import microseconds
from simsp.report.lessons.ring_attention import lesson_title
from simsp.report.lessons.stepping_js import STEPPING_JS
from simsp.report.lessons.ring_page import STYLE as RING_STYLE
from simsp.units import format_bytes

STYLE = RING_STYLE + """
table.qk td{width:34px;height:30px;text-align:center;font-size:11px;padding:0;
 border:1px solid #d0d5dd}table.qk th{font-size:11.5px;padding:2px 4px;white-space:nowrap}
table.qk.small td{width:24px;height:22px;font-size:9.5px}
table.qk td.masked{background:#eceef1;color:#c4c8ce}table.qk td.todo{background:#fff}
table.qk td.now{outline:3px solid #111;outline-offset:-3px}
.overlap{display:grid;grid-template-columns:230px 1fr;gap:4px 10px;align-items:center;
 max-width:640px;margin:6px 0 10px}.overlap .bar{height:16px}
.compute{background:#4c72b0}.send{background:#dd8452}
.work{display:grid;grid-template-columns:70px 1fr 170px;gap:3px 10px;align-items:center;
 width:640px}.work .bar{height:14px}.plain{background:#c44e52}.balanced{background:#55a868}
#step-lines div{font-family:monospace;font-size:14px;margin:2px 0}
#ring{flex:0 0 480px}
"""


def _rank_hues(cp: int) -> list[int]:
    """A hue per CP rank, spread round the wheel (the page's script uses the same)."""
    return [round(360 * r / cp) for r in range(cp)]


def _step_rows(data: dict) -> str:
    """Every step in one table: phase, the K/V each rank holds, what moves and its time, the
    block compute, the wait, cumulative time at the step's start."""
    rows, cp = [], data["cp"]
    for i, step in enumerate(data["steps"]):
        hop = step["transfer"]
        send = (f'{format_bytes(step["bytes_per_rank"])} {step["moves"]}<br><code>'
                f'{html.escape(hop["formula"])}</code>' if hop else "nothing")
        held = ", ".join(f"r{r}←r{j}" for r, j in enumerate(step["held"]))
        rows.append(f'<tr id="row-{i + 1}"><td>{i + 1}</td><td>{step["phase"]} '
                    f'{step["index"] + 1}/{cp}</td><td><small>{held}</small></td><td>{send}</td>'
                    f'<td><code>{html.escape(step["compute"]["formula"])}</code></td>'
                    f'<td class="num">{microseconds(step["exposed_s"])}</td>'
                    f'<td class="num">{microseconds(step["start_s"])}</td></tr>')
    return ('<div class="steps-box"><table class="steps"><thead><tr><th>step</th><th>phase</th>'
            '<th>K/V held (rank ← owner)</th><th>sent per rank: time = bytes ÷ (bandwidth × '
            'efficiency ÷ sharing) + latency</th><th>block attention: GEMMs × (FLOPs ÷ rate + '
            'launch)</th><th class="num">wait</th><th class="num">starts at</th></tr></thead>'
            '<tbody>' + "".join(rows) + "</tbody></table></div>")


def _plain_grid(cp: int) -> str:
    """The causal triangle cut into cp plain pieces: each (query, key) chunk block coloured by
    the rank whose queries it is (rank r owns query chunk r)."""
    hues, cells = _rank_hues(cp), []
    for q in range(cp):
        row = [f"<th>q{q} · r{q}</th>"]
        for k in range(cp):
            if k > q:
                row.append('<td class="masked"></td>')
                continue
            color = f"hsl({hues[q]},65%,78%)"
            fill = (f"linear-gradient(to top right,{color} 50%,#fff 50%)" if k == q else color)
            row.append(f'<td style="background:{fill}">r{q}</td>')
        cells.append("<tr>" + "".join(row) + "</tr>")
    head = "".join(f"<th>k{k}</th>" for k in range(cp))
    return (f'<table class="qk small"><thead><tr><th></th>{head}</tr></thead><tbody>'
            + "".join(cells) + "</tbody></table>")


def _work_bars(data: dict) -> str:
    """Causal pairs per rank, plain split against the 2·cp split, as bars."""
    balance = data["balance"]
    longest = max(balance["plain_pairs"])
    bars = []
    for r, (plain, mine) in enumerate(zip(balance["plain_pairs"], balance["balanced_pairs"])):
        for css, pairs, name in (("plain", plain, "plain"), ("balanced", mine, "2·cp")):
            bars.append(f'<div>{"rank " + str(r) if css == "plain" else ""}</div><div><div '
                        f'class="bar {css}" style="width:{100 * pairs / longest:.1f}%"></div>'
                        f'</div><div class="num">{pairs:,} <small>{name}</small></div>')
    return '<div class="work">' + "".join(bars) + "</div>"


def balance_panel(data: dict) -> str:
    """The causal triangle and why the 2·cp split balances it, with this page's numbers."""
    cp, s, c = data["cp"], data["seq_length"], data["chunk_tokens"]
    balance = data["balance"]
    plain, mine = balance["plain_pairs"], balance["balanced_pairs"]
    return (
        '<div class="panel" id="balance"><h2>The causal triangle, and why 2·cp chunks</h2>'
        f"<p>Causal attention lets query i see keys 0..i: of the s² = {s * s:,} (query, key) "
        f"pairs only the lower triangle, s(s+1)/2 = {balance['causal_pairs']:,}, is computed. "
        f"Cut the sequence into {cp} plain pieces and rank r owns query piece r: it sees r whole "
        f"blocks before its own and its own triangle. Rank 0 computes {plain[0]:,} pairs, rank "
        f"{cp - 1} {plain[-1]:,}; since every ring step waits for the slowest rank, the ring "
        f"runs at the pace of rank {cp - 1}.</p>"
        f"<div style=\"display:flex;gap:32px;flex-wrap:wrap\"><div>{_plain_grid(cp)}"
        f"<small>plain: query piece r is rank r's</small></div><div>{_work_bars(data)}"
        "</div></div>"
        f"<p>Megatron-LM cuts it into 2·cp = {2 * cp} chunks of c = {c} tokens instead and gives "
        f"rank r chunk r and chunk {2 * cp - 1}−r: an early chunk with few keys to see and a "
        f"late "
        f"one with many. In the grid above every rank's cells pair up the same way: at its first "
        f"step (its own K/V) two causal triangles and one full block, c(c+1) + c² pairs; at "
        f"every other step two full blocks, 2c² (K/V of an earlier rank: both its query chunks "
        f"against the first key chunk; of a later rank: its late query chunk against both). "
        f"Every rank computes {mine[0]:,} pairs, the triangle's {balance['causal_pairs']:,} "
        f"shared evenly: the busiest rank does {max(plain) / max(mine):.2f}× less than with the "
        f"plain cut (model/context_split.py).</p></div>")


def overlap_panel(data: dict) -> str:
    """What hides behind what: the longest send against the shortest block compute."""
    sends = [s for s in data["steps"] if s["transfer"]]
    longest = max(sends, key=lambda s: s["transfer_s"])
    shortest = min(data["steps"], key=lambda s: s["compute"]["time_s"])
    waits = sum(s["exposed_s"] for s in data["steps"])
    ratio = shortest["compute"]["time_s"] / longest["transfer_s"]
    return (
        '<div class="panel" id="overlap-panel"><h2>What the compute hides</h2>'
        "<p>Transformer Engine posts each step's send and receive <i>before</i> it computes the "
        "block it holds, so the next K/V block travels while this one is computed; a rank waits "
        "only when the block arrives later than its compute ends (training/context_parallel/ring.py runs that "
        "schedule on the modelled links). In backward the dK/dV of the block just computed "
        "travels with the next K/V, back to the block's owner.</p>"
        f"<p>Here the longest send is {microseconds(longest['transfer_s'])} "
        f"({longest['phase']} step {longest['index'] + 1}, "
        f"{format_bytes(longest['bytes_per_rank'])} of {longest['moves']}), the shortest block "
        f"compute {microseconds(shortest['compute']['time_s'])}"
        f" ({shortest['phase']} step {shortest['index'] + 1}): {ratio:.1f}× the send. Waits over "
        f"the whole forward and backward: {microseconds(waits)}. A block's FLOPs grow with "
        f"(s/cp)², its K/V bytes with s/cp, so shorter sequences, or more ranks on the same "
        "sequence, are where the ring's sends start to show.</p></div>")


def lesson_html(data: dict, title: str) -> str:
    """The whole page."""
    cp = data["cp"]
    intro = (f"<h1>{html.escape(title)}</h1><p class=\"meta\">CP = {cp} ranks on GPUs "
             f"{', '.join(map(str, data['gpus']))} ({data['nodes']} node(s) of "
             f"{data['gpus_per_node']} GPUs); s = {data['seq_length']} tokens cut into 2·cp = "
             f"{data['chunks']} chunks of {data['chunk_tokens']}; per TP rank "
             f"{data['heads']} query heads, {data['kv_heads']} K/V head(s), d = "
             f"{data['head_dim']}, b = {data['micro_batch']}: one rank's K/V block is "
             f"{format_bytes(data['kv_bytes'])}; link calibration "
             f"<code>{html.escape(data['calibration'])}</code>.</p>"
             "<p>Each CP rank keeps its own queries and passes K and V around the ring. The grid's "
             "rows are query chunks (with the rank that owns them), its columns key chunks; grey "
             "cells are masked by causality and never computed. A cell takes the colour of the "
             "rank that computed it (a triangle on the diagonal: only the causal half), outlined "
             "at the step that computes it; in backward it darkens (∇) when its gradient is "
             "done. Each step's send and block compute are derived beside each other.</p>"
             "<p class=\"keys\">Keys: <kbd>→</kbd> or <kbd>PageDown</kbd> next, <kbd>←</kbd> "
             "or "
             "<kbd>PageUp</kbd> back (a presenter's clicker sends these), <kbd>space</kbd> "
             "play/pause, <kbd>Home</kbd> start.</p>")
    lesson = ('<div class="lesson"><div id="ring"></div><div id="grid-box">'
              '<div class="controls"><button id="prev">◀ prev</button><button id="next">next ▶'
              '</button><button id="play">▶ play</button><button id="reset">reset</button>'
              '</div><div id="step-label"></div><div id="step-info"></div>'
              '<div id="step-lines"></div><div class="overlap" id="overlap"></div>'
              '<div id="grid"></div><p class="legend" id="grid-legend"></p></div></div>')
    body = (intro + lesson + "<h2>Every step</h2>" + _step_rows(data) + balance_panel(data)
            + overlap_panel(data))
    script = f"var DATA = {json.dumps(data, sort_keys=True)};\n{SCRIPT}"
    return page(title, body, STYLE, script)


def write_page(data: dict, path) -> Path:
    """`simsp ring --collective ring_attention --html FILE`: the page of the lesson `data`
    (report/lessons/ring_attention.py), written to `path`."""
    path = Path(path)
    write_file(path, lesson_html(data, lesson_title(data)))
    return path


# The page's script (plain ES5, no library): draws the ring as SVG and the (query chunk, key
# chunk) grid from DATA and steps through DATA.steps with the buttons and the keys. It registers
# a self-check (window.__checks.stepping) that clicks the buttons and presses the keys and
# reports whether the grid advanced, for the headless-browser test.
SCRIPT = (r"""
(function () {
  var cp = DATA.cp, steps = DATA.steps, chunks = DATA.chunks, current = 0, timer = null;
  var PERIOD = 1400;  // ms per step when playing
""" + STEPPING_JS + r"""
  function hue(r) { return Math.round(360 * r / cp); }
  function owner(c) {
    for (var r = 0; r < cp; r++) if (DATA.owned[r].indexOf(c) >= 0) return r;
    return -1;
  }
  function drawRing() {
    var size = 480, rad = 128, ring = ringCanvas(size, cp), svg = ring.svg, pos = ring.pos;
    var c = ring.c;
    for (var p = 0; p < cp; p++) {
      var a = pos(p, rad), b = pos((p + 1) % cp, rad), ib = DATA.links[p] === 'InfiniBand';
      el('line', {x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: ib ? '#d62728' : '#9aa5b1',
        'stroke-width': ib ? 3 : 2, 'stroke-dasharray': ib ? '6 4' : '', 'class': ib ? 'ib' : 'nvlink'}, svg);
    }
    var step = current > 0 ? steps[current - 1] : null;
    if (step) {
      step.sends.forEach(function (s) {
        var held = step.held[s[0]], a = pos(s[0], rad - 34), b = pos(s[1], rad - 34);
        el('path', {d: 'M ' + a[0] + ' ' + a[1] + ' L ' + b[0] + ' ' + b[1], fill: 'none',
          'class': 'send', stroke: 'hsl(' + hue(held) + ',65%,40%)', 'stroke-width': 3,
          'marker-end': 'url(#arrow' + held + ')'}, svg);
        var inside = (rad - 34) * Math.cos(Math.PI / cp) - 26;  // inside the arrows' chords
        var mid = pos(s[0] + (s[1] === (s[0] + 1) % cp ? 0.5 : -0.5), inside);
        var parts = step.carried[s[0]].replace(/ of /g, ' ').split(' + ');  // a line each
        parts.forEach(function (part, i) {
          var t = el('text', {x: mid[0], y: mid[1] + 4 + 12 * (i - (parts.length - 1) / 2),
            'text-anchor': 'middle', 'font-size': 9.5, fill: 'hsl(' + hue(held) + ',65%,32%)',
            stroke: '#fff', 'stroke-width': 3, 'paint-order': 'stroke'}, svg);
          t.textContent = part;
        });
      });
    }
    for (var q = 0; q < cp; q++) {
      var at = pos(q, rad), node = Math.floor(DATA.gpus[q] / DATA.gpus_per_node);
      el('circle', {cx: at[0], cy: at[1], r: 20, fill: 'hsl(' + hue(q) + ',65%,85%)',
        stroke: node % 2 ? '#c0392b' : '#34495e', 'stroke-width': 2}, svg);
      var label = el('text', {x: at[0], y: at[1] + 4, 'text-anchor': 'middle', 'font-size': 12,
        'font-weight': 600}, svg);
      label.textContent = 'r' + q;
      var g = pos(q, rad + 28), side = Math.cos(-Math.PI / 2 + 2 * Math.PI * q / cp);
      var anchor = side > 0.3 ? 'start' : side < -0.3 ? 'end' : 'middle';
      var top = g[1] < c ? -8 : 4;  // two lines, clear of the circle
      var gl = el('text', {x: g[0], y: g[1] + top, 'text-anchor': anchor, 'font-size': 10,
        fill: '#555'}, svg);
      gl.textContent = 'gpu' + DATA.gpus[q] + ' · q' + DATA.owned[q].join(',q');
      if (step) {
        var hl = el('text', {x: g[0], y: g[1] + top + 12, 'text-anchor': anchor, 'font-size': 10,
          'font-weight': 600, fill: 'hsl(' + hue(step.held[q]) + ',65%,32%)'}, svg);
        hl.textContent = 'holds K/V of r' + step.held[q];
      }
    }
    var key = el('text', {x: 8, y: size + 14, 'font-size': 12, fill: '#333'}, svg);
    key.textContent = DATA.nodes > 1 ? 'grey: NVLink; red dashed: InfiniBand between nodes (ring outline: node)'
      : 'every hop NVLink through the NVSwitch (one node)';
    var key2 = el('text', {x: 8, y: size + 28, 'font-size': 12, fill: '#333'}, svg);
    key2.textContent = 'arrows: the K/V block each rank sends on, and in backward the dK/dV it carries';
  }
  function cellState() {  // (q,k) -> {rank, phase, step}: the latest step up to now computing it
    var done = {};
    for (var j = 0; j < current; j++) {
      steps[j].blocks.forEach(function (b) {
        done[b[0] + ',' + b[1]] = {rank: b[3], phase: steps[j].phase, kind: b[2], now: j === current - 1};
      });
    }
    return done;
  }
  function drawGrid() {
    var done = cellState();
    var h = '<table class="qk" id="grid-table"><thead><tr><th></th>';
    for (var k = 0; k < chunks; k++) h += '<th>k' + k + '</th>';
    h += '</tr></thead><tbody>';
    for (var q = 0; q < chunks; q++) {
      var o = owner(q);
      h += '<tr><th style="color:hsl(' + hue(o) + ',65%,32%)">q' + q + ' · r' + o + '</th>';
      for (var k = 0; k < chunks; k++) {
        if (k > q) { h += '<td class="masked"></td>'; continue; }
        var d = done[q + ',' + k];
        if (!d) { h += '<td class="todo"></td>'; continue; }
        var grad = d.phase === 'backward', light = grad ? 50 : 82;
        var color = 'hsl(' + hue(d.rank) + ',65%,' + light + '%)';
        var fill = d.kind === 'diagonal' ? 'linear-gradient(to top right,' + color + ' 50%,#fff 50%)' : color;
        h += '<td class="done' + (d.now ? ' now' : '') + '" title="computed by rank ' + d.rank
          + ' in ' + d.phase + '" style="background:' + fill + ';color:' + (grad ? '#fff' : '#222') + '">'
          + (grad ? '∇' : '') + 'r' + d.rank + '</td>';
      }
      h += '</tr>';
    }
    document.getElementById('grid').innerHTML = h + '</tbody></table>';
    var legend = '';
    for (var r = 0; r < cp; r++) legend += '<span style="background:hsl(' + hue(r) + ',65%,82%)"></span>rank ' + r;
    legend += '<span style="background:#eceef1"></span>masked (causal)';
    legend += '<span style="background:linear-gradient(to top right,#999 50%,#fff 50%)"></span>diagonal: causal half';
    document.getElementById('grid-legend').innerHTML = legend;
  }
  function line(text) { var d = document.createElement('div'); d.textContent = text; return d; }
  function overlapBars(s) {
    var longest = Math.max(s.compute.time_s, s.transfer_s) || 1;
    function bar(name, css, t) {
      return '<div>' + name + ' ' + fmtTime(t) + '</div><div><div class="bar ' + css
        + '" style="width:' + (100 * t / longest).toFixed(1) + '%"></div></div>';
    }
    return bar('block compute', 'compute', s.compute.time_s)
      + (s.transfer ? bar('send (' + s.moves + ')', 'send', s.transfer_s) : '');
  }
  function label() {
    var l = document.getElementById('step-label'), info = document.getElementById('step-info');
    var lines = document.getElementById('step-lines');
    lines.innerHTML = ''; document.getElementById('overlap').innerHTML = '';
    var rows = document.querySelectorAll('table.steps tr.current');
    for (var i = 0; i < rows.length; i++) rows[i].className = '';
    if (current === 0) {
      l.textContent = 'Start: each rank holds the queries, keys and values of its two chunks';
      info.textContent = cp + ' forward steps, then ' + cp + ' backward steps. Press next or play '
        + '(keys: → or PageDown, ← or PageUp, space).';
      return;
    }
    var s = steps[current - 1], fwd = s.phase === 'forward';
    l.textContent = s.phase + ' step ' + (s.index + 1) + '/' + cp;
    info.textContent = (fwd ? 'Each rank computes its queries against the K/V block it holds (rank r holds '
        + (s.index ? 'rank r−' + s.index + '\'s, mod ' + cp : 'its own') + ')' : 'Each rank recomputes the block it holds (rank r holds '
        + (s.index + 1 === cp ? 'its own K/V again' : 'rank r+' + (s.index + 1) + '\'s K/V, mod ' + cp)
        + ') and adds its share of that block\'s dK/dV')
      + (s.sends.length ? ', while it sends ' + s.moves + ' (' + fmtBytes(s.bytes_per_rank) + ') to rank r'
        + (fwd ? '+1' : '−1') + ':' : '; nothing left to send:');
    if (s.transfer) lines.appendChild(line('send: ' + s.transfer.formula + '  (gpu' + s.transfer.src
      + ' → gpu' + s.transfer.dst + ', ' + s.transfer.link + ')'));
    lines.appendChild(line('block attention: ' + s.compute.formula));
    lines.appendChild(line(s.verdict));
    document.getElementById('overlap').innerHTML = overlapBars(s);
    var row = document.getElementById('row-' + current);
    if (row) row.className = 'current';
  }
  function render() { drawRing(); drawGrid(); label(); }
  var wanted = /step=(\d+)/.exec(window.location.hash);
  show(wanted ? +wanted[1] : 0);
  function gridText() { return document.getElementById('grid-table').textContent; }
  function count(selector) { return document.querySelectorAll(selector).length; }
  window.__checks.stepping = function () {
    var initial = current;
    show(1);
    var arrows = count('#ring-svg .send');
    show(cp);
    var forwardCells = count('#grid-table td.done'), masked = count('#grid-table td.masked');
    show(steps.length);
    var gradCells = 0, cells = document.querySelectorAll('#grid-table td.done');
    for (var i = 0; i < cells.length; i++) if (cells[i].textContent.charAt(0) === '∇') gradCells++;
    var verdict = checkStepping(gridText, {arrows_at_first: arrows,
      cells_after_forward: forwardCells, masked_cells: masked, grad_cells_at_end: gradCells,
      formula_at_end: document.getElementById('step-lines').textContent});
    show(initial);
    return verdict;
  };
})();
""")
