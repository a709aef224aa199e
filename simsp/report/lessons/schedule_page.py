"""The pipeline-schedule lesson as one self-contained page: each schedule's ranks as rows of ops
on one time axis (F, B, W, full backward, F&B pairs; idle time grey), a shared time cursor
stepped with buttons, autoplay and keys, each step listing the ops that start then with their
start derived (rank free, input there); the bubbles and activations against the published
closed forms; why W fills the bubble. Inline SVG, CSS and JS, no network. The numbers all come
from the lesson model (report/lessons/schedule.py)."""
import html
import json
from pathlib import Path

from simsp.io_out import write_file
from simsp.report.html import page
from simsp.report.lessons.stepping_js import STEPPING_JS
from simsp.report.lessons.schedule import number, why

UNIT_PX, ROW_PX, LEFT_PX = 36, 28, 64
COLOURS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}
STYLE = """
.controls{margin:10px 0;display:flex;gap:8px;align-items:center;flex-wrap:wrap}
.controls button{font-size:15px;padding:5px 14px;border:1px solid #b8c0cc;border-radius:6px;
 background:#f4f6f9;cursor:pointer}
#step-label{font-weight:600;font-size:17px}
#step-info{font-family:monospace;font-size:13px;min-height:5em;white-space:pre-wrap;
 background:#fafbfc;border:1px solid #e5e7eb;border-radius:6px;padding:8px;margin:6px 0 14px}
svg.timeline .op{stroke:#222;stroke-width:.6}svg.timeline g.future{opacity:.12}
svg.timeline g.running rect.box{stroke:#000;stroke-width:2.5}
svg.timeline text{font-size:10px;fill:#fff;pointer-events:none}
svg.timeline text.axis{fill:#333;font-size:11px}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px -1px 12px}
.keys kbd{border:1px solid #b8c0cc;border-radius:3px;padding:0 4px;font-size:12px}
"""


def write_page(data: dict, path) -> Path:
    """`simsp schedule --html FILE`: the page of the lesson `data`, written to `path`."""
    path = Path(path)
    write_file(path, lesson_html(data))
    return path


def lesson_html(data: dict) -> str:
    """The whole page."""
    titles = ", ".join(s["title"] for s in data["schedules"])
    title = f"Pipeline schedules on {data['ranks']} ranks: {titles}"
    controls = ('<div class="controls"><button id="prev">◀ prev</button><button id="next">'
                'next ▶</button><button id="play">▶ play</button><button id="reset">reset'
                '</button></div><div id="step-label"></div><div id="step-info"></div>')
    timelines = "".join(f"<h3>{html.escape(s['title'])}</h3>{_timeline_svg(s)}"
                        for s in data["schedules"])
    body = (f"<h1>{html.escape(title)}</h1>{_intro(data)}{controls}{_legend()}{timelines}"
            f"<h2>Bubbles and memory against the published forms</h2>{_summary_table(data)}"
            f"{_why_w_fills()}")
    steps = _steps(data)
    script = f"var STEPS = {json.dumps(steps, sort_keys=True)};\n{SCRIPT}"
    return page(title, body, STYLE, script)


def _intro(data: dict) -> str:
    """What the page shows and the times it uses."""
    times = data["durations"]
    return (f"<p>{data['micro_batches']} micro-batches on {data['ranks']} pipeline ranks, no "
            f"communication time. One stage's forward F = {number(times['F'])}, its "
            f"input-gradient backward B = {number(times['B'])} and weight-gradient backward W "
            f"= {number(times['W'])} units (Qi et al., Zero Bubble Pipeline Parallelism, "
            f"arXiv:2401.10241); a full backward BW = B + W; DualPipe's overlapped forward and "
            f"backward F&amp;B = {number(times['F&B'])}. Each rank runs its ops in order; an op "
            f"starts when its rank is free and its input is there (the previous stage's F, the "
            f"next stage's B). Step through time: the ops starting at each step are listed with "
            f"that start derived; grey is idle time, the bubble.</p><p class=\"keys\">Keys: "
            f"<kbd>→</kbd> or <kbd>PageDown</kbd> next, <kbd>←</kbd> or <kbd>PageUp</kbd> back, "
            f"<kbd>space</kbd> play/pause, <kbd>Home</kbd> start.</p>")


def _legend() -> str:
    """Colour key of the ops."""
    keys = [("F", "forward F"), ("B", "input gradient B"), ("W", "weight gradient W")]
    spans = "".join(f'<span style="background:{COLOURS[k]}"></span>{words}' for k, words in keys)
    return (f'<p class="legend">{spans}<span style="background:#e4e4e4"></span>idle; a full '
            f'backward BW is drawn B then W, an F&amp;B pair F over BW.</p>')


def _timeline_svg(schedule: dict) -> str:
    """One schedule: a row per rank, every op a box from its start to its end."""
    width = LEFT_PX + schedule["iteration_time"] * UNIT_PX + 10
    height = ROW_PX * schedule["ranks"] + 22
    parts = [f'<svg class="timeline" width="{width:.0f}" height="{height}" '
             f'viewBox="0 0 {width:.0f} {height}" role="img" '
             f'aria-label="{html.escape(schedule["title"])} timeline">']
    for rank, ops in enumerate(schedule["ops"]):
        y = rank * ROW_PX
        parts.append(f'<text class="axis" x="2" y="{y + 18}">rank {rank}</text>'
                     f'<rect x="{LEFT_PX}" y="{y + 2}" width="{width - LEFT_PX - 10:.1f}" '
                     f'height="{ROW_PX - 4}" fill="#e4e4e4"/>')
        parts += [_op_svg(op, y) for op in ops]
    axis_y = ROW_PX * schedule["ranks"] + 14
    parts.append(f'<text class="axis" x="{LEFT_PX}" y="{axis_y}">0</text><text class="axis" '
                 f'x="{width - 40:.0f}" y="{axis_y}">{number(schedule["iteration_time"])}</text>'
                 f'<line class="cursor" x1="{LEFT_PX}" x2="{LEFT_PX}" y1="0" y2="{axis_y - 10}" '
                 f'stroke="#c00" stroke-width="2"/></svg>')
    return "".join(parts)


def _op_svg(op: dict, y: float) -> str:
    """One op's group: its coloured pieces and its label, with its start and end as data."""
    x0, x1 = LEFT_PX + op["start"] * UNIT_PX, LEFT_PX + op["end"] * UNIT_PX
    pieces = _pieces(op["kinds"], x0, x1, y + 2, ROW_PX - 4)
    label = html.escape(op["label"])
    text = f'<text x="{x0 + 2:.1f}" y="{y + 18}">{label}</text>' if x1 - x0 > 30 else ""
    return (f'<g class="future" data-start="{op["start"]}" data-end="{op["end"]}">'
            f'<title>{label}: {number(op["start"])} to {number(op["end"])}</title>{pieces}'
            f'<rect class="box" x="{x0:.1f}" y="{y + 2}" width="{x1 - x0:.1f}" '
            f'height="{ROW_PX - 4}" fill="none" stroke="#222"/>{text}</g>')


def _pieces(kinds: list[str], x0: float, x1: float, y: float, h: float) -> str:
    """Coloured rectangles: one colour per kind, BW as B then W, a pair's F above its BW."""
    if len(kinds) == 2:
        return _pieces(kinds[:1], x0, x1, y, h / 2) + _pieces(kinds[1:], x0, x1, y + h / 2, h / 2)
    if kinds[0] == "BW":
        middle = (x0 + x1) / 2
        return _pieces(["B"], x0, middle, y, h) + _pieces(["W"], middle, x1, y, h)
    return (f'<rect class="op" x="{x0:.1f}" y="{y:.1f}" width="{x1 - x0:.1f}" '
            f'height="{h:.1f}" fill="{COLOURS[kinds[0]]}"/>')


def _steps(data: dict) -> list[dict]:
    """Every time an op starts (and the end): what starts then, per schedule, derived."""
    times = sorted({op["start"] for s in data["schedules"] for ops in s["ops"] for op in ops}
                   | {s["iteration_time"] for s in data["schedules"]})
    steps = []
    for t in times:
        lines = []
        for s in data["schedules"]:
            starting = [why(op, rank) for rank, ops in enumerate(s["ops"]) for op in ops
                        if op["start"] == t]
            lines += [f"{s['title']}: {line}" for line in starting]
            if s["iteration_time"] == t:
                lines.append(f"{s['title']}: every rank done at {number(t)}: bubble "
                             f"{number(max(s['bubble']))} per rank")
        steps.append({"time": t, "label": f"t = {number(t)}", "lines": lines})
    return steps


def _summary_table(data: dict) -> str:
    """Per schedule: iteration, bubble per rank simulated and published, activations."""
    rows = "".join(
        f"<tr><td>{html.escape(s['title'])}</td><td>{s['stages']}</td>"
        f"<td>{number(s['iteration_time'])}</td><td>{number(max(s['bubble']))}</td>"
        f"<td>{number(s['bubble_published'])}</td><td><code>{s['bubble_formula']}</code></td>"
        f"<td>{max(s['activations'])}</td><td>{s['activations_published']}</td></tr>"
        for s in data["schedules"])
    return ("<table><tr><th>schedule</th><th>stages PP</th><th>iteration</th><th>bubble per "
            "rank</th><th>published</th><th>formula</th><th>peak activations</th>"
            f"<th>published</th></tr>{rows}</table><p>The formulas are the DeepSeek-V3 "
            "report's Table 2 (arXiv:2412.19437), whose B is the full backward (B + W here). "
            "Activations count one stage's activations of one micro-batch; a DualPipeV chunk "
            "is half a stage (its times are halved here so that every schedule does the same "
            "work), so its PP + 1 are half as big; DualPipe holds 2× the parameters.</p>")


def _why_w_fills() -> str:
    """The lesson's point, in words."""
    return ("<h2>Why W fills the bubble</h2><p>In 1F1B a stage's backward is one block: the "
            "stage before it waits for the whole of it, although it needs only the input "
            "gradient B. Nobody waits for the weight gradient W, so zero-bubble schedules run "
            "B first and W later: the critical path through the pipeline carries F and B only, "
            "and each rank's W passes move into the time it would otherwise sit idle. ZB-H1 "
            "starts stage i's W passes i micro-batches late, so the last stage runs F and B "
            "back to back, and keeps 1F1B's activations; its bubble drops from (PP−1)(F+B) to "
            "(PP−1)(F+B−2W) in Table 2's notation. DualPipe feeds micro-batches from both ends: "
            "each rank holds a stage of each direction, so one direction's warm-up fills the "
            "other's, F&amp;B pairs hide one micro-batch's communication behind another's "
            "compute, and W deferred at the start and end fills what is left: (PP/2−1)(F&amp;B"
            "+B−3W), for twice the parameters and one more stage of activations.</p>")


# The page's script (plain ES5): steps a time cursor through STEPS, marking every op done,
# running or still to come, and lists the ops starting at that time with their derivation. It
# registers a self-check (window.__checks.stepping) for the headless-browser test.
SCRIPT = (r"""
(function () {
  var steps = STEPS, current = 0, timer = null, PERIOD = 900;
""" + STEPPING_JS + r"""
  var UNIT = """ + str(UNIT_PX) + ", LEFT = " + str(LEFT_PX) + r""";
  function render() {
    var t = current === 0 ? -1 : steps[current - 1].time;
    var groups = document.querySelectorAll('svg.timeline g');
    for (var i = 0; i < groups.length; i++) {
      var g = groups[i], s = +g.getAttribute('data-start'), e = +g.getAttribute('data-end');
      g.setAttribute('class', e <= t ? 'done' : (s <= t ? 'running' : 'future'));
    }
    var cursors = document.querySelectorAll('svg.timeline line.cursor');
    for (var c = 0; c < cursors.length; c++) {
      var x = LEFT + Math.max(t, 0) * UNIT;
      cursors[c].setAttribute('x1', x); cursors[c].setAttribute('x2', x);
    }
    document.getElementById('step-label').textContent = current === 0 ?
      'before the first op (step 0 of ' + steps.length + ')' :
      steps[current - 1].label + ' (step ' + current + ' of ' + steps.length + ')';
    document.getElementById('step-info').textContent = current === 0 ?
      'Press next: at t = 0 the first ops start.' : steps[current - 1].lines.join('\n');
  }
  var wanted = /step=(\d+)/.exec(window.location.hash);
  show(wanted ? +wanted[1] : 0);
  function info() { return document.getElementById('step-info').textContent +
    document.querySelectorAll('svg.timeline g.done').length; }
  window.__checks.stepping = function () {
    var initial = current;
    show(steps.length);
    var doneAtEnd = document.querySelectorAll('svg.timeline g.done').length;
    var total = document.querySelectorAll('svg.timeline g').length;
    var verdict = checkStepping(info, {all_done_at_end: doneAtEnd === total, ops: total});
    show(initial);
    return verdict;
  };
})();
""")
