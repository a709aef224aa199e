"""How livable the code is, counted: files, files and functions one `simsp run` executes,
modules one `simsp run` imports (a dense and a MoE scenario; which MoE, MLA, CP, FSDP, offload
and MTP modules the dense run imports, and what imported each), functions and their sizes,
imports against the layering, dead functions, and citations of files the repository does not
have. Run before and after a restructuring to compare.

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
import subprocess
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
DENSE, SPARSE = "paper-175b", "deepseek-v3"  # scenarios/*.toml of the run counts
# module names of the code a dense GPT run should not need: MoE, MLA, context parallelism (its
# ring and the positions it splits), sharded data parallelism, activation offload, MTP
FEATURE_CODE = re.compile(r"moe|mla|context_parallel|context_split|cp_|ring_attention|fsdp|"
                          r"offload|mtp")
# run in a fresh interpreter: {simsp module: the simsp modules whose import statements named it}
IMPORTS_OF_RUN = """
import builtins, collections, contextlib, io, json, sys, tempfile
importers, real_import = collections.defaultdict(set), builtins.__import__
def traced(name, globals=None, locals=None, fromlist=(), level=0):
    module = real_import(name, globals, locals, fromlist, level)
    if level == 0 and name.startswith("simsp"):
        for target in [name] + [f"{name}.{item}" for item in fromlist or ()]:
            if target in sys.modules:
                importers[target].add((globals or {}).get("__name__", "?"))
    return module
builtins.__import__ = traced
from simsp.cli import main
with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
    main(["run", sys.argv[1], "--quiet", "--trace", "none", "--out", out])
print(json.dumps({m: sorted(importers[m]) for m in sorted(sys.modules)
                  if m.split(".")[0] == "simsp"}))
"""


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


def imported_by_run(scenario: str) -> dict[str, list]:
    """{simsp module: the modules that imported it} after one `simsp run SCENARIO` (report
    written to a temporary folder, no trace) in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", IMPORTS_OF_RUN, scenario], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def feature_modules(imported: dict[str, list]) -> list[str]:
    """'module <- importers' for each MoE, MLA, CP, FSDP, offload or MTP module imported; the
    scenario's own checks and fields (simsp.scenario: every run validates every setting) are
    settings, not the features' code."""
    return [f"{name} <- {', '.join(by) or '(a package: its module was imported)'}"
            for name, by in imported.items()
            if FEATURE_CODE.search(name) and not name.startswith("simsp.scenario.")]


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
        imported = {name: imported_by_run(str(ROOT / "scenarios" / f"{name}.toml"))
                    for name in (DENSE, SPARSE)}
        result["modules_imported_by_run"] = {name: len(mods) for name, mods in imported.items()}
        result["feature_modules_imported_by_dense_run"] = feature_modules(imported[DENSE])
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
