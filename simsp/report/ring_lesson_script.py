"""The ring lesson page's script (plain ES5, no library): draws the ring as SVG and the rank x
chunk grid from DATA, and steps through DATA.steps with prev/next/play/reset. It also registers
a self-check (window.__checks.stepping) that clicks the buttons and reports whether the grid
advanced, for the headless-browser test."""

SCRIPT = r"""
(function () {
  var n = DATA.ranks, steps = DATA.steps, current = 0, channel = 0, timer = null;
  var NAMES = {all_reduce: 'all-reduce', reduce_scatter: 'reduce-scatter', all_gather: 'all-gather'};
  var SVGNS = 'http://www.w3.org/2000/svg';
  function hue(c) { return Math.round(360 * c / n); }
  function fmtBytes(b) {
    var u = [['GiB', 1073741824], ['MiB', 1048576], ['KiB', 1024]];
    for (var i = 0; i < u.length; i++) if (b >= u[i][1]) return (b / u[i][1]).toFixed(2) + ' ' + u[i][0];
    return b + ' B';
  }
  function fmtTime(s) {
    if (s >= 1) return s.toFixed(3) + ' s';
    if (s >= 1e-3) return (s * 1e3).toFixed(3) + ' ms';
    return (s * 1e6).toFixed(3) + ' µs';
  }
  function holdings(k) { return k === 0 ? DATA.start : steps[k - 1].holdings; }
  function el(tag, attrs, parent) {
    var e = document.createElementNS(SVGNS, tag);
    for (var a in attrs) e.setAttribute(a, attrs[a]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function rankOf(p) { return DATA.channels[channel].order[p]; }
  function gpuOf(p) { return DATA.gpus[rankOf(p)]; }
  function drawRing() {
    var box = document.getElementById('ring'); box.innerHTML = '';
    var size = 420, c = size / 2, r = 150, svg = el('svg', {width: size, height: size + 30,
      viewBox: '0 0 ' + size + ' ' + (size + 30), id: 'ring-svg'}, box);
    var defs = el('defs', {}, svg);
    for (var k = 0; k < n; k++) {
      var m = el('marker', {id: 'arrow' + k, viewBox: '0 0 10 10', refX: 9, refY: 5,
        markerWidth: 5, markerHeight: 5, orient: 'auto-start-reverse'}, defs);
      el('path', {d: 'M 0 0 L 10 5 L 0 10 z', fill: 'hsl(' + hue(k) + ',65%,40%)'}, m);
    }
    function pos(p, rad) {
      var a = -Math.PI / 2 + 2 * Math.PI * p / n;
      return [c + rad * Math.cos(a), c + rad * Math.sin(a)];
    }
    var hops = DATA.channels[channel].hops;
    for (var p = 0; p < n; p++) {
      var a = pos(p, r), b = pos((p + 1) % n, r), ib = hops[p] === 'InfiniBand';
      el('line', {x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: ib ? '#d62728' : '#9aa5b1',
        'stroke-width': ib ? 4 : 2, 'stroke-dasharray': ib ? '6 4' : ''}, svg);
    }
    if (current > 0) {
      steps[current - 1].sends.forEach(function (s) {
        var a = pos(s[0], r - 32), b = pos(s[1], r - 32);
        el('line', {x1: a[0], y1: a[1], x2: b[0], y2: b[1], 'class': 'send',
          stroke: 'hsl(' + hue(s[2]) + ',65%,40%)', 'stroke-width': 3,
          'marker-end': 'url(#arrow' + s[2] + ')'}, svg);
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
    key.textContent = DATA.nodes > 1 ? 'grey: NVLink inside a node; red dashed: InfiniBand'
      : 'all hops NVLink (one node)';
    if (DATA.nodes > 1) {
      var key2 = el('text', {x: 8, y: size + 27, 'font-size': 12, fill: '#333'}, svg);
      key2.textContent = 'between nodes; circle colour: node (blue even, orange odd)';
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
    if (current === 0) {
      l.textContent = 'Start: ' + (DATA.collective === 'all_gather' ? 'each rank holds only its own chunk'
        : 'each rank holds its own data, all ' + n + ' chunks');
      info.textContent = NAMES[DATA.collective] + ' of ' + fmtBytes(DATA.size_bytes) + ': '
        + steps.length + ' steps. Press next or play.';
      return;
    }
    var s = steps[current - 1], done = 0;
    for (var k = 0; k < current; k++) done += steps[k].time_s;
    l.textContent = NAMES[s.phase] + ' step ' + (s.index + 1) + '/' + (n - 1)
      + (DATA.collective === 'all_reduce' ? '  (all-reduce step ' + current + '/' + steps.length + ')' : '');
    info.textContent = 'every rank sends one chunk (' + fmtBytes(s.bytes_per_rank) + ') to the next and '
      + (s.phase === 'reduce_scatter' ? 'adds what it receives' : 'copies what it receives')
      + '; modelled time ' + fmtTime(s.time_s) + ' (cumulative ' + fmtTime(done) + ')';
    var row = document.getElementById('row-' + current);
    if (row) row.className = 'current';
  }
  function show(k) { current = Math.max(0, Math.min(steps.length, k)); drawRing(); drawGrid(); label(); }
  function play() {
    var b = document.getElementById('play');
    if (timer) { clearInterval(timer); timer = null; b.textContent = '▶ play'; return; }
    if (current === steps.length) show(0);
    b.textContent = '❚❚ pause';
    timer = setInterval(function () { if (current >= steps.length) { play(); return; } show(current + 1); }, 1100);
  }
  document.getElementById('prev').onclick = function () { show(current - 1); };
  document.getElementById('next').onclick = function () { show(current + 1); };
  document.getElementById('reset').onclick = function () { show(0); };
  document.getElementById('play').onclick = play;
  if (DATA.channels.length > 1) {
    var sel = '<label>channel <select id="channel">';
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
    document.getElementById('reset').click();
    var start = gridText(), label0 = document.getElementById('step-label').textContent;
    document.getElementById('next').click();
    var after = gridText(), label1 = document.getElementById('step-label').textContent;
    document.getElementById('prev').click();
    var back = gridText();
    for (var k = 0; k < steps.length; k++) document.getElementById('next').click();
    var cells = document.querySelectorAll('#grid-table td'), full = 0, filled = 0;
    for (var i = 0; i < cells.length; i++) {
      if (cells[i].textContent === 'all') full++;
      if (cells[i].className.indexOf('empty') < 0) filled++;
    }
    var arrows = document.querySelectorAll('#ring-svg line.send').length;
    show(initial);
    return {advanced: after !== start && label1 !== label0, back: back === start,
            steps: steps.length, full_cells_at_end: full, filled_cells_at_end: filled, arrows_at_end: arrows};
  };
})();
"""
