"""The small Markdown subset summary_md writes (headings, tables, paragraphs, `code`, **bold**,
*italic*) as HTML, so report.html says exactly what summary.md says."""

import html
import re

INLINE = ((re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
          (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
          (re.compile(r"\*([^*]+)\*"), r"<em>\1</em>"))


def inline(text: str) -> str:
    """Escape `text` and apply the inline markup."""
    out = html.escape(text, quote=False)
    for pattern, replacement in INLINE:
        out = pattern.sub(replacement, out)
    return out


NUM = ' class="num"'


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table(lines: list[str]) -> str:
    """A Markdown table (header, alignment row, body) as an HTML table."""
    header, align, *body = [_cells(line) for line in lines]
    right = [a.endswith(":") for a in align]

    def row(cells, tag):
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
            out.append(f"<h{level}>{inline(first[level:].strip())}</h{level}>")
            block = block[1:]
            if not block:
                continue
        if block[0].startswith("|"):
            out.append(table(block))
        else:
            out.append("<p>" + inline(" ".join(block)) + "</p>")
    return "\n".join(out)
