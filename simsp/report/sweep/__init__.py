"""report.md of a sweep or a search (`simsp sweep`, `simsp search`, simsp.sweep): the
configurations ranked, the commands that reproduce the best, why the invalid ones failed
(report_md.py), and its pictures (plots.py)."""
