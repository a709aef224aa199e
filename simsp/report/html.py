"""The shell every simsp page shares (the run report, the ring lessons, the what-if page), and
the Markdown subset the reports are written in, converted to HTML.

Sections: the page shell (inline CSS, no external resource, a self-check a headless browser can
read), and Markdown to HTML.
"""

import base64
import html
import re


# ---------------------------------------------------------------------------------------------
# The page shell
# ---------------------------------------------------------------------------------------------
#
# The shell of simsp's self-contained HTML pages: inline CSS, no external resource, and a tiny
# self-check that writes a JSON verdict (pictures rendered, script errors) into <pre id="page-check">
# so a headless browser's --dump-dom can read it.

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


# ---------------------------------------------------------------------------------------------
# Markdown to HTML
# ---------------------------------------------------------------------------------------------
#
# The small Markdown subset summary_md writes (headings, tables, paragraphs, `code`, **bold**,
# *italic*) as HTML, so report.html says exactly what summary.md says.

INLINE = ((re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
          (re.compile(r"\*([^*]+)\*"), r"<em>\1</em>"))
# a code span: a run of backticks, the code, the same run (CommonMark; io_out.markdown_code)
CODE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")


ESCAPED = re.compile(r"\\([\\`*_{}\[\]#!|<>&~])")  # io_out.markdown_text's backslash escapes
HELD = "\ue000"  # a private-use character standing for an escaped one while markup is applied
CODE_HELD = "\ue001"  # one standing for a code span while the other markup is applied


def inline(text: str) -> str:
    """Escape `text` and apply the inline markup; a backslash-escaped character (user text
    written by io_out.markdown_text) is that character, never markup, and a code span's text
    is never markup either."""
    held = ESCAPED.findall(text)
    out = ESCAPED.sub(HELD, text.replace(HELD, "").replace(CODE_HELD, ""))
    codes = []
    out = html.escape(CODE.sub(lambda match: _hold_code(match, codes), out), quote=False)
    for pattern, replacement in INLINE:
        out = pattern.sub(replacement, out)
    out = "".join(piece + (f"<code>{html.escape(code, quote=False)}</code>" if i < len(codes)
                           else "") for i, (piece, code) in
                  enumerate(zip(out.split(CODE_HELD), codes + [""])))
    pieces = out.split(HELD)
    return pieces[0] + "".join(html.escape(char, quote=False) + piece
                               for char, piece in zip(held, pieces[1:]))


def _hold_code(match, codes: list) -> str:
    """A code span's text kept aside (one space each side stripped, as CommonMark does)."""
    body = match.group(2)
    if len(body) > 2 and body.startswith(" ") and body.endswith(" ") and body.strip():
        body = body[1:-1]
    codes.append(body)
    return CODE_HELD


NUM = ' class="num"'


def slug(title: str) -> str:
    """'Memory per pipeline stage (rank tp 0, dp 0)' -> 'memory-per-pipeline-stage-rank-tp-0-dp-0'."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _cells(line: str) -> list[str]:
    """A table line's cells, split at the pipes that are not backslash-escaped (`\\|` is a
    pipe inside a cell, as in GitHub's Markdown)."""
    inner = line.strip().removeprefix("|")
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def table(lines: list[str]) -> str:
    """A Markdown table (header, alignment row, body) as an HTML table."""
    header, align, *body = [_cells(line) for line in lines]
    right = [a.endswith(":") for a in align]

    def row(cells, tag):
        """One table row of `tag` cells, numbers right-aligned."""
        return "<tr>" + "".join(f"<{tag}{NUM if r else ''}>{inline(c)}</{tag}>"
                                for c, r in zip(cells, right)) + "</tr>"
    return ("<table><thead>" + row(header, "th") + "</thead><tbody>"
            + "".join(row(cells, "td") for cells in body) + "</tbody></table>")


def _blocks(text: str) -> list[list[str]]:
    """Blank-line separated blocks of lines."""
    blocks, current = [], []
    for line in text.split("\n"):
        if line.strip():
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    return blocks + ([current] if current else [])


def to_html(text: str) -> str:
    """The Markdown `text` as HTML blocks."""
    out = []
    for block in _blocks(text):
        first = block[0]
        if first.startswith("#"):
            level = len(first) - len(first.lstrip("#"))
            title = first[level:].strip()
            out.append(f'<h{level} id="{slug(title)}">{inline(title)}</h{level}>')
            block = block[1:]
            if not block:
                continue
        if block[0].startswith("|"):
            out.append(table(block))
        else:
            out.append("<p>" + inline(" ".join(block)) + "</p>")
    return "\n".join(out)
