"""How livable the code is, counted: files, files and functions one `simsp run` executes,
functions and their sizes, imports against the layering, dead functions, and citations of files
the repository does not have. Run before and after a restructuring to compare.

    python benchmarks/house_counts.py [--no-run] [--json]

The layering (docs/ARCHITECTURE.md) and the dead-function rule live in tests/layering.py, which
the tests use too; this script only counts.
"""

import argparse
import ast
import contextlib
import inspect
import io
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from layering import back_arrows, dead_functions, package_files  # noqa: E402

OUTSIDE = re.compile(r"REFERENCE\.md|DESIGN\.md|\.\./shared")
# "issue N" alone is this project's tracker; "owner/repo issue N" cites an upstream one
ISSUE = re.compile(r"(\S+\s+)?issue \d+")
CITING_TREES = ("simsp", "tests", "benchmarks", "scenarios", "sweeps", "docs", "README.md")


def function_sizes(files: list[Path]) -> list[tuple[int, str]]:
    """(lines, 'file:name') of every def in the files, methods and nested functions included."""
    sizes = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                sizes.append((lines, f"{path.relative_to(ROOT)}:{node.name}"))
    return sizes


def _cites_outside(line: str) -> bool:
    """Whether the line names a file or an issue of this project the repository does not hold."""
    return bool(OUTSIDE.search(line)) or any(
        "/" not in (match.group(1) or "") for match in ISSUE.finditer(line))


def outside_citations() -> list[str]:
    """'path:line' of every mention of a file or issue the repository does not hold."""
    hits = []
    for name in CITING_TREES:
        base = ROOT / name
        paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in paths:
            if path.suffix not in (".py", ".md", ".toml", ".txt", ".html", ".js", ".css"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if _cites_outside(line) and path.name != "house_counts.py":
                    hits.append(f"{path.relative_to(ROOT)}:{number}")
    return hits


def executed_by_run(scenario: str) -> tuple[int, int]:
    """Distinct simsp files and functions whose code runs in one `simsp run SCENARIO` (this
    process and, through a file per forked painter, its workers)."""
    seen_dir = Path(tempfile.mkdtemp(prefix="house-counts-"))
    package = str(ROOT / "simsp")
    seen: set = set()

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(package) and code.co_flags & inspect.CO_NEWLOCALS \
                    and not code.co_name.startswith("<"):  # functions: no module/class body
                seen.add((code.co_filename, code.co_firstlineno, code.co_name))

    def dump_at_exit():
        (seen_dir / f"{os.getpid()}.json").write_text(json.dumps(sorted(seen)))

    _patch_exit(dump_at_exit)
    os.register_at_fork(after_in_child=lambda: (seen.clear(), sys.setprofile(profile)))
    from simsp.cli import main
    sys.setprofile(profile)
    with contextlib.redirect_stdout(io.StringIO()):
        main(["run", scenario, "--quiet", "--out", str(seen_dir / "out")])
    sys.setprofile(None)
    dump_at_exit()
    union = set()
    for path in seen_dir.glob("*.json"):
        union.update(tuple(item) for item in json.loads(path.read_text()))
    files = {f for f, _, _ in union}
    if os.environ.get("HOUSE_COUNTS_LIST"):
        print("\n".join(sorted(files)), file=sys.stderr)
    return len(files), len(union)


def _patch_exit(hook) -> None:
    """Forked painters leave through os._exit: write their record first."""
    real_exit = os._exit

    def exit_with_record(code):
        try:
            hook()
        finally:
            real_exit(code)
    os._exit = exit_with_record


def counts(run: bool) -> dict:
    """Every count of the module docstring."""
    files = package_files()
    sizes = sorted(function_sizes(files))
    lengths = [n for n, _ in sizes]
    result = {
        "files": len(files),
        "lines": sum(len(p.read_text().splitlines()) for p in files),
        "functions": len(sizes),
        "median_function_lines": statistics.median(lengths),
        "largest_function": f"{sizes[-1][0]} lines, {sizes[-1][1]}",
        "back_arrows": back_arrows(),
        "dead_functions": dead_functions(),
        "outside_citations": outside_citations(),
    }
    if run:
        run_files, run_functions = executed_by_run(str(ROOT / "scenarios" / "paper-175b.toml"))
        result["files_executed_by_run"] = run_files
        result["functions_executed_by_run"] = run_functions
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-run", action="store_true", help="skip the traced simsp run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = counts(not args.no_run)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for key, value in result.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"    {item}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
