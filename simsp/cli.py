"""The `simsp` command: subcommands live in simsp/commands/, each with add_parser and run."""

import importlib
import os
import signal
import sys

from simsp.version import __version__
from simsp.errors import UserError, one_line
from simsp.scenario.flags import Parser
from simsp.progress import add_quiet_flag

COMMANDS = ("run", "layer", "verify", "ring", "schedule", "calibrate", "validate", "sweep",
            "search", "whatif", "hardware", "probe", "memory")
EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 2, 130, 141  # 128 + SIGINT, 128 + SIGPIPE


def build_parser() -> Parser:
    """The top-level parser with one subparser per command module."""
    parser = Parser(prog="simsp", description="Simulate GPT training on emulated A100 clusters.")
    parser.add_argument("--version", action="version", version=f"simsp {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"simsp.commands.{name}")
        module.add_parser(subparsers)
        add_quiet_flag(subparsers.choices[name])
    return parser


def command_list(parser: Parser) -> str:
    """What bare `simsp` prints: usage and one line per command (its --help summary)."""
    action = parser._subparsers._group_actions[0]
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: simsp COMMAND [flags]   (simsp COMMAND --help: its flags; simsp "
             "--version)", "", "commands:"]
    lines += [f"  {choice.dest:<{width}}  {choice.help}" for choice in action._choices_actions]
    return "\n".join(lines) + "\n"


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is quiet
    (the recipe of Python's signal module documentation, 'Note on SIGPIPE')."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout without a file descriptor (captured in tests): nothing will flush it


def _dispatch(args) -> int:
    """Run the command and flush stdout inside the handlers' reach."""
    code = args.handler(args)
    sys.stdout.flush()
    return code


def main(argv: list[str] | None = None, process_ends: bool = False) -> int:
    """Entry point: parse, dispatch; a UserError is one `error:` line and exit 2, a closed pipe
    exits quietly (141), Ctrl-C prints `interrupted` and exits 130. `process_ends`: the process
    exits right after (the installed script), so what it built need not be collected."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser()
        if not argv:  # bare `simsp`: the command list, exit 0 (README "Commands")
            sys.stdout.write(command_list(parser))
            return 0
        args = parser.parse_args(argv)
        args.argv = argv  # the command line as given, for reports that state what made them
        args.process_ends = process_ends
        return _dispatch(args)
    except UserError as exc:
        sys.stderr.write(f"error: {one_line(exc)}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED


def console() -> None:
    """The installed `simsp` script and `python -m simsp.cli`: main, then exit with its code.

    The exit skips the interpreter's teardown (os._exit once stdout and stderr are flushed):
    every file is closed and every child reaped by then, and freeing a paper-scale run's
    millions of objects one by one would only cost time (0.1 to 0.3 s for 175B here)."""
    if hasattr(signal, "SIGXFSZ"):  # a file-size limit is a write error to report, not a kill
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    code = main(process_ends=True)
    _flush_streams()
    os._exit(code)


def _flush_streams() -> None:
    """Flush stdout and stderr as the interpreter's exit would; a closed pipe is quiet."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # nobody is reading any more (main already chose the exit code)


if __name__ == "__main__":
    console()
