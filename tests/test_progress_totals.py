"""Long commands show progress with a total on stderr (simsp/progress.py): `validate` per row;
stdout is the same with or without the bar."""

import sys

from simsp.cli import main


def test_validate_draws_a_bar_of_rows_with_their_total(capsys, monkeypatch):
    """On a terminal, `simsp validate --only table4` counts its rows done out of the group's
    total on stderr (simsp/progress.py); the table on stdout is the same as with --quiet."""
    import sys
    assert main(["validate", "--only", "table4", "--quiet"]) == 0
    quiet = capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["validate", "--only", "table4"]) == 0
    shown = capsys.readouterr()
    assert shown.out == quiet.out and quiet.err == ""
    rows = int(shown.err.split("validate: table4: ")[1].split(" row")[0])
    assert rows > 1 and f"validate table4:   0%|" in shown.err and f"| 0/{rows} [" in shown.err
