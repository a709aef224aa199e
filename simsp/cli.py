"""The `simsp` command: subcommands live in simsp/commands/, each with add_parser and run."""

import importlib
import sys

from simsp.errors import UserError
from simsp.flags import Parser
from simsp.progress import add_quiet_flag

COMMANDS = ("run", "layer", "verify", "ring", "calibrate", "validate", "sweep", "search")


def build_parser() -> Parser:
    """The top-level parser with one subparser per command module."""
    parser = Parser(prog="simsp", description="Simulate GPT training on emulated A100 clusters.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"simsp.commands.{name}")
        module.add_parser(subparsers)
        add_quiet_flag(subparsers.choices[name])
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse, dispatch, and turn a UserError into one `error:` line with exit 2."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the command line as given, for reports that state what made them
    try:
        return args.handler(args)
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
