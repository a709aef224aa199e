"""Long commands show progress with a total on stderr (simsp/progress.py): `validate` per row;
the Python API's sweep as `simsp sweep` (configurations done / total) unless quiet=True;
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
    assert rows > 1 and "validate table4:   0%|" in shown.err and f"| 0/{rows} [" in shown.err


def test_the_api_sweep_draws_the_commands_bar_unless_quiet(capsys, monkeypatch, tmp_path):
    """simsp.sweep on a terminal: `simsp sweep`'s bar with the total of configurations to
    simulate (2 here); quiet=True: nothing on stderr."""
    import simsp
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    simsp.sweep(None, workers=0, out=tmp_path / "a", num_layers=2, hidden_size=64,
                num_attention_heads=4, seq_length=32, vocab_size=128, mode="meta",
                micro_batch_size="1,2")
    assert "| 0/2 [" in capsys.readouterr().err
    simsp.sweep(None, workers=0, out=tmp_path / "b", quiet=True, num_layers=2, hidden_size=64,
                num_attention_heads=4, seq_length=32, vocab_size=128, mode="meta",
                micro_batch_size="1,2")
    assert capsys.readouterr().err == ""
