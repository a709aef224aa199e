"""The ring teaching page's script: the ring and the rank x chunk grid drawn from DATA, stepped
through DATA.steps."""

from simsp.report.lessons.stepping_js import STEPPING_JS

# The page's script (plain ES5, no library): draws the ring as SVG and the rank x chunk grid
# from DATA and steps through DATA.steps with the buttons and the keys. It registers a
# self-check (window.__checks.stepping) that clicks the buttons and presses the keys and reports
# whether the grid advanced, for the headless-browser test.
SCRIPT = (r"""
(function () {
  var n = DATA.ranks, steps = DATA.steps, current = 0, channel = 0, timer = null;
  var PERIOD = 1100;  // ms per step when playing
""" + STEPPING_JS + r"""  var NAMES = {all_reduce: 'all-reduce', reduce_scatter: 'reduce-scatter', all_gather: 'all-gather'};
  function hue(c) { return Math.round(360 * c / n); }
  function hopPath(h) {
    return h.via === null ? 'gpu' + h.src + ' → gpu' + h.dst
      : 'gpu' + h.src + ' → gpu' + h.via + ' (NVLink, PXN) → gpu' + h.dst;
  }
  function holdings(k) { return k === 0 ? DATA.start : steps[k - 1].holdings; }
  function rankOf(p) { return DATA.channels[channel].order[p]; }
  function positionOfGpu(g) {
    for (var q = 0; q < n; q++) if (gpuOf(q) === g) return q;
    return 0;
  }
  function gpuOf(p) { return DATA.gpus[rankOf(p)]; }
  function drawRing() {
    var size = 420, r = 150, ring = ringCanvas(size, n), svg = ring.svg, pos = ring.pos;
    var hops = DATA.channels[channel].hops, via = DATA.channels[channel].via;
    for (var p = 0; p < n; p++) {
      var a = pos(p, r), b = pos((p + 1) % n, r), ib = hops[p] === 'InfiniBand';
      if (via[p] !== null) {  // PXN: NVLink to the GPU whose NIC is on the rail, then across
        var q = positionOfGpu(via[p]), relay = pos(q, r), bend = pos(p + 0.5, r * 0.55);
        el('path', {d: 'M ' + a[0] + ' ' + a[1] + ' Q ' + bend[0] + ' ' + bend[1] + ' '
          + relay[0] + ' ' + relay[1], fill: 'none', stroke: '#7f8c8d', 'stroke-width': 2,
          'stroke-dasharray': '2 3', 'class': 'pxn'}, svg);
        var tag = el('text', {x: bend[0], y: bend[1] - 4, 'text-anchor': 'middle',
          'font-size': 10, fill: '#555'}, svg);
        tag.textContent = 'PXN via gpu' + via[p];
        a = relay;
      }
      if (ib) {  // each direction of a NIC-to-NIC leg beside the other, not on top of it
        var dx = b[0] - a[0], dy = b[1] - a[1], len = Math.sqrt(dx * dx + dy * dy) || 1;
        a = [a[0] - 4 * dy / len, a[1] + 4 * dx / len]; b = [b[0] - 4 * dy / len, b[1] + 4 * dx / len];
      }
      el('line', {x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: ib ? '#d62728' : '#9aa5b1',
        'stroke-width': ib ? 3 : 2, 'stroke-dasharray': ib ? '6 4' : '', 'class': ib ? 'ib' : 'nvlink'}, svg);
    }
    if (current > 0) {
      steps[current - 1].sends.forEach(function (s) {
        var a = pos(s[0], r - 32), b = pos(s[1], r - 32), m = a;
        if (via[s[0]] !== null) m = pos(positionOfGpu(via[s[0]]), r - 32);  // relayed: via PXN
        el('path', {d: 'M ' + a[0] + ' ' + a[1] + ' L ' + m[0] + ' ' + m[1] + ' L ' + b[0] + ' '
          + b[1], fill: 'none', 'class': 'send', stroke: 'hsl(' + hue(s[2]) + ',65%,40%)',
          'stroke-width': 3, 'marker-end': 'url(#arrow' + s[2] + ')'}, svg);
        var mid = pos(s[0] + 0.5, r - 52), t = el('text', {x: mid[0], y: mid[1] + 4,
          'text-anchor': 'middle', 'font-size': 11, fill: 'hsl(' + hue(s[2]) + ',65%,35%)'}, svg);
        t.textContent = 'c' + s[2];
      });
    }
    for (var q = 0; q < n; q++) {
      var at = pos(q, r), node = Math.floor(gpuOf(q) / DATA.gpus_per_node);
      el('circle', {cx: at[0], cy: at[1], r: 17, fill: node % 2 ? '#fde9d9' : '#dde8f6',
        stroke: '#34495e', 'stroke-width': 1.5}, svg);
      var label = el('text', {x: at[0], y: at[1] + 4, 'text-anchor': 'middle', 'font-size': 12,
        'font-weight': 600}, svg);
      label.textContent = 'r' + rankOf(q);
      var g = pos(q, r + 32), gl = el('text', {x: g[0], y: g[1] + 4, 'text-anchor': 'middle',
        'font-size': 10, fill: '#555'}, svg);
      gl.textContent = 'gpu' + gpuOf(q);
    }
    var key = el('text', {x: 8, y: size + 12, 'font-size': 12, fill: '#333'}, svg);
    key.textContent = DATA.nodes > 1 ? 'grey: NVLink; red dashed: InfiniBand, NIC to NIC;'
      : 'all hops NVLink through the NVSwitch (one node)';
    if (DATA.nodes > 1) {
      var key2 = el('text', {x: 8, y: size + 27, 'font-size': 12, fill: '#333'}, svg);
      key2.textContent = 'dotted: PXN relay over NVLink; circle colour: node (blue, orange)';
    }
  }
  function drawGrid() {
    var held = holdings(current), recv = {};
    if (current > 0) steps[current - 1].sends.forEach(function (s) { recv[s[1] + ',' + s[2]] = 1; });
    var h = '<table class="grid' + (n <= 8 ? ' big' : '') + '" id="grid-table"><thead><tr><th></th>';
    for (var c = 0; c < n; c++) h += '<th style="color:hsl(' + hue(c) + ',65%,35%)">c' + c + '</th>';
    h += '</tr></thead><tbody>';
    for (var p = 0; p < n; p++) {
      h += '<tr><th>r' + rankOf(p) + '</th>';
      for (var k = 0; k < n; k++) {
        var who = held[p][k], m = who.length, cls = recv[p + ',' + k] ? ' recv' : '';
        if (m === 0) { h += '<td class="empty' + cls + '">–</td>'; continue; }
        var gather = DATA.collective === 'all_gather';
        var light = gather ? 55 : 90 - 48 * (m - 1) / Math.max(n - 1, 1);
        h += '<td class="' + cls + '" title="sum of ranks ' + who.join('+') + '" style="background:hsl('
          + hue(k) + ',65%,' + light + '%);color:' + (light < 60 ? '#fff' : '#222') + '">'
          + (gather ? 'r' + who[0] : m === n ? 'all' : m) + '</td>';
      }
      h += '</tr>';
    }
    document.getElementById('grid').innerHTML = h + '</tbody></table>';
  }
  function label() {
    var l = document.getElementById('step-label'), info = document.getElementById('step-info');
    var rows = document.querySelectorAll('table.steps tr.current');
    for (var i = 0; i < rows.length; i++) rows[i].className = '';
    document.getElementById('step-formula').textContent = '';
    if (current === 0) {
      l.textContent = 'Start: ' + (DATA.collective === 'all_gather' ? 'each rank holds only its own chunk'
        : 'each rank holds its own data, all ' + n + ' chunks');
      info.textContent = NAMES[DATA.collective] + ' of ' + fmtBytes(DATA.size_bytes) + ': '
        + steps.length + ' steps. Press next or play (keys: → or PageDown, ← or PageUp, space).';
      return;
    }
    var s = steps[current - 1], done = 0;
    for (var k = 0; k < current; k++) done += steps[k].time_s;
    l.textContent = NAMES[s.phase] + ' step ' + (s.index + 1) + '/' + (n - 1)
      + (DATA.collective === 'all_reduce' ? '  (all-reduce step ' + current + '/' + steps.length + ')' : '');
    info.textContent = 'every rank sends one chunk (' + fmtBytes(s.bytes_per_rank) + ') to the next and '
      + (s.phase === 'reduce_scatter' ? 'adds what it receives' : 'copies what it receives')
      + (DATA.channels.length > 1 ? ', 1/' + DATA.channels.length + ' of it on each ring order' : '')
      + '. The step lasts as long as its slowest hop, ' + hopPath(s.hop) + ' over ' + s.hop.link
      + ' (ring order ' + s.hop.channel + '):';
    document.getElementById('step-formula').textContent = s.hop.formula
      + '   (cumulative ' + fmtTime(done) + ')';
    var row = document.getElementById('row-' + current);
    if (row) row.className = 'current';
  }
  function render() { drawRing(); drawGrid(); label(); }
  if (DATA.channels.length > 1) {
    var sel = '<label>ring order <select id="channel">';
    DATA.channels.forEach(function (ch) {
      sel += '<option value="' + ch.index + '">' + ch.index + (ch.rail === null ? '' : ' (rail ' + ch.rail + ')') + '</option>';
    });
    document.getElementById('channel-box').innerHTML = sel + '</select></label> of ' + DATA.channels.length;
    document.getElementById('channel').onchange = function (e) { channel = +e.target.value; show(current); };
  }
  var wanted = /step=(\d+)/.exec(window.location.hash);
  show(wanted ? +wanted[1] : 0);
  function gridText() { return document.getElementById('grid-table').textContent; }
  window.__checks.stepping = function () {
    var initial = current;
    show(steps.length);
    var cells = document.querySelectorAll('#grid-table td'), full = 0, filled = 0;
    for (var i = 0; i < cells.length; i++) {
      if (cells[i].textContent === 'all') full++;
      if (cells[i].className.indexOf('empty') < 0) filled++;
    }
    var verdict = checkStepping(gridText, {full_cells_at_end: full, filled_cells_at_end: filled,
      arrows_at_end: document.querySelectorAll('#ring-svg .send').length,
      formula_at_end: document.getElementById('step-formula').textContent,
      relayed_hops: document.querySelectorAll('#ring-svg path.pxn').length});
    show(initial);
    return verdict;
  };
})();
""")
