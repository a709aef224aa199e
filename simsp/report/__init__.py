"""What simsp writes for people to read, one sub-package per kind of output (each formats
results it is handed; none runs an exploration, a fit or a validation):

- run/: the report of one `simsp run` (summary.md, report.html, metrics.json, trace.json and the
  figures), written by run.write_reports.
- lessons/: `simsp ring`'s tables and teaching material: the nccl-tests style tables (ring
  collectives, all-to-all), and the ring and ring-attention lessons as text, pages and slides.
- sweep/: report.md of a sweep or a search (the configurations ranked) and its pictures.
- whatif/: `simsp whatif`'s comparison with the baseline and its page.
- html.py: the page shell every HTML page shares, and the Markdown subset the reports are
  written in, converted to HTML.
"""
