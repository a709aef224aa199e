"""The benchmark scripts' command lines, checked as simsp's are before any measurement starts:
every bad argument is one `error: <field>: <reason>` line and exit status 2 (simsp's Parser,
simsp/scenario/flags.py; its files through simsp/io_in.py and simsp/io_out.py)."""

import argparse
import json
import math
import sys

from simsp.errors import UserError, one_line
from simsp.io_in import read_text
from simsp.io_out import check_out_file
from simsp.scenario.flags import Parser


def parser(description: str) -> Parser:
    """An argument parser whose errors are one line (no usage dump), no abbreviations."""
    return Parser(description=description)


def number_in(kind, low: float, high: float):
    """argparse type: a finite `kind` (int or float) in (low, high] (a float: above low; an
    int: at least low + 1), else one line saying the range."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a{'n integer' if kind is int else ' number'}"
                                             f": {text!r}") from None
        if not (math.isfinite(value) and low < value <= high):
            raise argparse.ArgumentTypeError(f"{text} is outside ({low:g}, {high:g}]")
        return value
    return parse


def distinct(names: list[str], flag: str) -> list[str]:
    """`names` once each: a name given twice is an error (it would be measured twice)."""
    twice = [name for index, name in enumerate(names) if name in names[:index]]
    if twice:
        raise UserError(flag, f"{twice[0]!r} is named twice")
    return names


def out_file(path, flag: str, inputs: list = ()) -> None:
    """A file the run will write at its end, checked before it measures anything."""
    if path is not None:
        check_out_file(path, flag, [p for p in inputs if p is not None])


def read_json(path, flag: str):
    """A JSON file the user named (a regular UTF-8 file of at most 4 MiB), parsed."""
    text = read_text(path, "measurements")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(flag, f"{path}:{exc.lineno}: is not JSON: {exc.msg}") from None


def run_main(main, argv=None) -> None:
    """Run `main(argv)`; a UserError is one `error:` line and exit status 2."""
    try:
        main(argv)
    except UserError as exc:
        sys.stderr.write(f"error: {one_line(exc)}\n")
        sys.exit(2)
