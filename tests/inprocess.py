"""Run the `simsp` command line in this process, as the catalogue and fuzz tests do."""

import contextlib
import io

from simsp.cli import main


def cli(argv: list[str]) -> tuple[int, str, str]:
    """simsp.cli.main in-process with stdout/stderr captured; argparse exits become codes."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()
