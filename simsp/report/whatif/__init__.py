"""`simsp whatif`'s output: each variant against the baseline (comparison.py) and the page that
shows it, whatif.md and whatif.html (page.py)."""
