"""simsp's layering and its dead functions, read from the source with ast (docs/ARCHITECTURE.md).

Every import points down the layers; within a layer any import is fine except between two
peers: two commands, or two of the drivers explore/, calibrate/ and validation/ (what two peers
share lives in a lower layer). The package root
`simsp` holds the lazy `simsp.sweep` facade of simsp/api.py; `__version__` lives in simsp/version.py,
so no module below the facade imports the root.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "simsp"

# lowest first; a module's layer is that of its longest listed prefix
LAYERS = (
    ("simsp", "simsp.errors", "simsp.units", "simsp.jsonout", "simsp.scenario",
     "simsp.hardware.constants", "simsp.hardware.costmodel", "simsp.analytic", "simsp.progress",
     "simsp.outdir", "simsp.gc_pause"),
    ("simsp.cluster",),
    ("simsp.engine",),
    ("simsp.model",),
    ("simsp.training",),
    ("simsp.shortcuts",),
    ("simsp.training.driver",),
    ("simsp.metrics",),
    ("simsp.report",),
    ("simsp.explore", "simsp.calibrate", "simsp.validation"),
    ("simsp.commands", "simsp.api"),
    ("simsp.cli",),
)
# the root's one lazy import: `simsp.sweep(...)` is the Python twin of `simsp sweep`
FACADE = {("simsp", "simsp.api")}
# peers of one layer that never import each other: each command module, and these drivers (a
# driver's own modules import each other freely)
DRIVERS = ("simsp.explore", "simsp.calibrate", "simsp.validation")


def package_files() -> list[Path]:
    """Every .py file of the package, sorted."""
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    """simsp/engine/network.py -> simsp.engine.network; a package's __init__ -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """Index in LAYERS of the longest prefix naming the module."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise KeyError(f"{module}: in no layer of tests/layering.py LAYERS")
    return best


def imports_of(path: Path) -> set[str]:
    """simsp modules the file imports anywhere (top level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "simsp")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "simsp":
            for alias in node.names:  # `from simsp import analytic` imports a module
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT / Path(*sub.split("."))).with_suffix(".py").exists() \
                    or (ROOT / Path(*sub.split("."))).is_dir()
                found.add(sub if is_module else node.module)
    return found


def peer_of(module: str) -> tuple[str, str] | None:
    """(group, peer) of a module that has peers: ("command", the module) for each command,
    ("driver", its package) for the drivers; None for any other module."""
    if module.startswith("simsp.commands."):
        return "command", module
    for driver in DRIVERS:
        if module == driver or module.startswith(driver + "."):
            return "driver", driver
    return None


def _sideways(source: str, target: str) -> bool:
    """Whether source and target are two different peers of one group."""
    mine, theirs = peer_of(source), peer_of(target)
    return mine is not None and theirs is not None and mine[0] == theirs[0] and mine != theirs


def arrows_against_layers(source: str, targets) -> list[str]:
    """'source -> target' for each target of a higher layer, or another peer."""
    arrows = []
    for target in sorted(targets):
        if (source, target) in FACADE or target == source:
            continue
        up = layer_of(target) > layer_of(source)
        sideways = _sideways(source, target)
        if up or sideways:
            arrows.append(f"{source} -> {target}")
    return arrows


def root_importers() -> list[str]:
    """Modules importing the package root `simsp` itself (its facade imports simsp.api, so any
    such import below the API closes a circle)."""
    return [module_name(path) for path in package_files()
            if module_name(path) != "simsp" and "simsp" in imports_of(path)]


def back_arrows() -> list[str]:
    """'a -> b' for every import of a higher layer, and between two peers."""
    return [arrow for path in package_files()
            for arrow in arrows_against_layers(module_name(path), imports_of(path))]


# names reached without being written as a call in the package: entry points, protocols
ENTRY_POINTS = {"console", "add_parser", "run", "sweep", "main",
                "find_class", "persistent_load"}  # pickle.Unpickler's hooks


# the closed forms tests compare the simulation with (docs/MODEL.md): their users are the tests
ORACLES = ("simsp/analytic.py",)


def _word_counts(paths) -> dict[str, int]:
    """How often each identifier is written in the files."""
    words: dict[str, int] = {}
    for path in paths:
        for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text()):
            words[word] = words.get(word, 0) + 1
    return words


def dead_functions() -> list[str]:
    """'file:name' of each function or method whose name is written nowhere else in the package
    or benchmarks/ (tests do not count, but for the oracles: code kept only for its tests is
    dead). By name, so a method sharing its name with a used one is not caught."""
    users = _word_counts([*package_files(), *sorted((ROOT / "benchmarks").glob("*.py"))])
    tests = _word_counts(sorted((ROOT / "tests").glob("*.py")))
    dead = []
    for path in package_files():
        relative = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            name = node.name
            if name.startswith("__") or name in ENTRY_POINTS:
                continue
            uses = users.get(name, 0) - 1  # less the def itself
            if relative in ORACLES:
                uses += tests.get(name, 0)
            if uses <= 0:
                dead.append(f"{relative}:{name}")
    return dead
