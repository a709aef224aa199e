"""report.html: the run report as one self-contained page (summary, pictures, glossary).

The text is summary_md's, converted (report/html.py); the pictures are report/run/figures/'s PNGs
embedded as data URIs, so the page opens with no network and no other file.
"""

import html
from pathlib import Path

from simsp.io_out import write_file
from simsp.report.html import figure, page, slug, to_html
from simsp.report.run.glossary import glossary
from simsp.report.run.shown_categories import report_categories
from simsp.report.run.summary_md import summary_text, variant_label


def glossary_html(metrics: dict) -> str:
    """The glossary as a definition list (the terms of the categories the report shows)."""
    items = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(meaning)}</dd>"
                    for term, meaning in glossary(report_categories(metrics)))
    return f'<h2 id="glossary">Glossary</h2><dl class="glossary">{items}</dl>'


def figures_html(figures: list[tuple[str, str, bytes]]) -> str:
    """The Figures section: every picture embedded."""
    if not figures:
        return ""
    return '<h2 id="figures">Figures</h2>' + "".join(
        figure(png, caption, name.removesuffix(".png")) for name, caption, png in figures)


def contents(text: str, figures: bool) -> str:
    """A line of links to the page's sections (the ## headings, then figures and glossary)."""
    titles = [line[3:].strip() for line in text.split("\n") if line.startswith("## ")]
    links = [(slug(t), t) for t in titles] + ([("figures", "Figures")] if figures else [])
    links.append(("glossary", "Glossary"))
    return '<nav class="meta">' + " · ".join(
        f'<a href="#{anchor}">{html.escape(name)}</a>' for anchor, name in links) + "</nav>"


def report_html(metrics: dict, figures: list[tuple[str, str, bytes]] = ()) -> str:
    """The whole page: the summary text, the figures, the glossary."""
    markdown = summary_text(metrics)
    text = to_html(markdown).replace(  # the out-of-memory verdict stands out
        "<p><strong>Out of memory</strong>", '<p class="callout"><strong>Out of memory</strong>')
    head, rest = text.split("\n", 1)  # the title, then everything else
    body = (head + contents(markdown, bool(figures)) + rest + figures_html(list(figures))
            + glossary_html(metrics))
    return page(f"simsp run: {variant_label(metrics)}", body)


def write_report_html(metrics: dict, figures, path) -> Path:
    """Write report_html to `path` and return the path."""
    path = Path(path)
    write_file(path, report_html(metrics, figures))
    return path
