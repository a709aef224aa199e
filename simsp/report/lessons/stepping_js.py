"""The script every lesson page shares: number formats, an SVG element maker, the ring's canvas,
and stepping by buttons and by the keys a keyboard or a presenter's clicker sends."""

# What both lesson pages' scripts share (pasted inside each page's closure, which declares
# `steps`, `current`, `timer`, PERIOD, hue(k) and render()): number formats as the Python side writes
# them, an SVG element maker, the ring's canvas, and the stepping: show(k), play(), the buttons (#prev, #next,
# #play, #reset) and the keys a keyboard or a presenter's clicker sends.
STEPPING_JS = r"""
  var SVGNS = 'http://www.w3.org/2000/svg';
  function fmtBytes(b) {
    var u = [['GiB', 1073741824], ['MiB', 1048576], ['KiB', 1024]];
    for (var i = 0; i < u.length; i++) if (b >= u[i][1]) return (b / u[i][1]).toFixed(2) + ' ' + u[i][0];
    return b + ' B';
  }
  function fmtTime(s) {  // every time of the lesson in one unit, as the Python side writes it
    return (s * 1e6).toLocaleString('en-US', {minimumFractionDigits: 2, maximumFractionDigits: 2}) + ' µs';
  }
  function el(tag, attrs, parent) {
    var e = document.createElementNS(SVGNS, tag);
    for (var a in attrs) e.setAttribute(a, attrs[a]);
    if (parent) parent.appendChild(e);
    return e;
  }
  // #ring emptied for a new SVG drawing `size` square (a key line below it) with an arrowhead
  // per colour index k (#arrowk, hue(k)); pos(p, radius) places ring position p of `count`
  // clockwise from the top.
  function ringCanvas(size, count) {
    var box = document.getElementById('ring'); box.innerHTML = '';
    var c = size / 2, svg = el('svg', {width: size, height: size + 30,
      viewBox: '0 0 ' + size + ' ' + (size + 30), id: 'ring-svg'}, box);
    var defs = el('defs', {}, svg);
    for (var k = 0; k < count; k++) {
      var m = el('marker', {id: 'arrow' + k, viewBox: '0 0 10 10', refX: 9, refY: 5,
        markerWidth: 5, markerHeight: 5, orient: 'auto-start-reverse'}, defs);
      el('path', {d: 'M 0 0 L 10 5 L 0 10 z', fill: 'hsl(' + hue(k) + ',65%,40%)'}, m);
    }
    function pos(p, radius) {
      var a = -Math.PI / 2 + 2 * Math.PI * p / count;
      return [c + radius * Math.cos(a), c + radius * Math.sin(a)];
    }
    return {svg: svg, c: c, pos: pos};
  }
  // The stepping's self-check (window.__checks), merged into `verdict`: from the start, the
  // next button changes what `text()` reads and the step label, prev brings it back; → and
  // PageDown step on, PageUp back, space plays and pauses.
  function checkStepping(text, verdict) {
    function key(name) { document.dispatchEvent(new KeyboardEvent('keydown', {key: name, bubbles: true})); }
    function label() { return document.getElementById('step-label').textContent; }
    document.getElementById('reset').click();
    var start = text(), label0 = label();
    document.getElementById('next').click();
    var after = text(), label1 = label();
    document.getElementById('prev').click();
    verdict.advanced = after !== start && label1 !== label0;
    verdict.back = text() === start;
    verdict.steps = steps.length;
    key('ArrowRight'); var byArrow = text();
    key('PageDown'); var byPage = text(), atTwo = current;
    key('PageUp'); var byPageUp = current;
    key(' '); var playing = timer !== null; key(' '); var paused = timer === null;
    verdict.keys_advanced = byArrow !== start && byPage !== byArrow && atTwo === 2;
    verdict.page_up = byPageUp === 1;
    verdict.space_plays = playing && paused;
    return verdict;
  }
  function show(k) { current = Math.max(0, Math.min(steps.length, k)); render(); }
  function play() {
    var b = document.getElementById('play');
    if (timer) { clearInterval(timer); timer = null; b.textContent = '▶ play'; return; }
    if (current === steps.length) show(0);
    b.textContent = '❚❚ pause';
    timer = setInterval(function () { if (current >= steps.length) { play(); return; } show(current + 1); }, PERIOD);
  }
  document.getElementById('prev').onclick = function () { show(current - 1); };
  document.getElementById('next').onclick = function () { show(current + 1); };
  document.getElementById('reset').onclick = function () { show(0); };
  document.getElementById('play').onclick = play;
  // a keyboard or a presenter's clicker (which sends PageUp/PageDown) steps the lesson
  document.addEventListener('keydown', function (e) {
    if (e.target && e.target.tagName === 'SELECT') return;
    var k = e.key;
    if (k === 'ArrowRight' || k === 'PageDown' || k === 'ArrowDown') show(current + 1);
    else if (k === 'ArrowLeft' || k === 'PageUp' || k === 'ArrowUp') show(current - 1);
    else if (k === ' ' || k === 'Spacebar') play();
    else if (k === 'Home') show(0);
    else if (k === 'End') show(steps.length);
    else return;
    e.preventDefault();
  });
"""
