"""The shell of simsp's self-contained HTML pages: inline CSS, no external resource, and a tiny
self-check that writes a JSON verdict (pictures rendered, script errors) into <pre id="page-check">
so a headless browser's --dump-dom can read it."""

import base64
import html

STYLE = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d1d1f;
 margin:0;background:#f6f7f9}
main{max-width:1320px;margin:0 auto;padding:24px 32px 64px;background:#fff;
 box-shadow:0 0 12px rgba(0,0,0,.06)}
h1{font-size:26px;margin:8px 0 4px}h2{font-size:20px;margin:32px 0 8px;
 border-bottom:2px solid #e5e7eb;padding-bottom:4px}h3{font-size:16px;margin:20px 0 6px}
table{border-collapse:collapse;margin:8px 0 12px;font-size:13.5px}
th,td{border:1px solid #e0e3e8;padding:3px 9px;text-align:left}
th{background:#f0f2f5}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;
 white-space:nowrap}
p.callout{background:#fdecee;border-left:5px solid #b00020;padding:10px 14px;border-radius:4px}
tbody tr:nth-child(even){background:#fafbfc}
code{background:#f0f2f5;padding:1px 4px;border-radius:3px;font-size:90%}
figure{margin:18px 0}figure img{max-width:100%;border:1px solid #e5e7eb}
figcaption{color:#555;font-size:13.5px}
dl.glossary dt{font-weight:600;margin-top:8px}dl.glossary dd{margin:2px 0 0 20px}
.meta{color:#555}.oom{color:#b00020;font-weight:600}
#page-check{display:none}
"""

SELF_CHECK = """
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
window.__checks = window.__checks || {};
function pageCheck() {
  var imgs = Array.prototype.slice.call(document.images);
  var verdict = {images: imgs.length,
                 rendered: imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length,
                 svgs: document.querySelectorAll('svg').length};
  for (var k in window.__checks) {
    try { verdict[k] = window.__checks[k](); } catch (e) { window.__errors.push(k + ': ' + e); }
  }
  verdict.errors = window.__errors;
  document.getElementById('page-check').textContent = JSON.stringify(verdict);
}
window.addEventListener('load', pageCheck);
"""


def png_data_uri(png: bytes) -> str:
    """PNG bytes as a data: URI (the page needs no other file)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def figure(png: bytes, caption: str, name: str) -> str:
    """An embedded picture with its caption."""
    alt = html.escape(caption)
    return (f'<figure id="fig-{html.escape(name)}"><img alt="{alt}" src="{png_data_uri(png)}">'
            f"<figcaption>{alt}</figcaption></figure>")


def page(title: str, body: str, style: str = "", script: str = "") -> str:
    """A whole self-contained HTML document."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}{style}</style>"
            f"<script>{SELF_CHECK}</script></head>\n<body><main>\n{body}\n"
            f"<pre id=\"page-check\"></pre></main><script>{script}</script></body></html>\n")
