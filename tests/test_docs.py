"""Every citation of the project's own docs points at a file and a section that exist (GitHub's
anchors: a heading lower-cased, punctuation dropped, spaces as hyphens); every project file the
docs and README name in backticks exists, and every name cited right after one (`file.py` `name`)
is in it."""

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r"docs/([A-Za-z_-]+\.md)((?:#[a-z0-9-]+)?)((?:, #[a-z0-9-]+)*)")
TREES = ("simsp", "tests", "benchmarks", "scenarios", "sweeps", "docs")


def anchors(doc: Path) -> set[str]:
    """The anchors of a Markdown file's headings."""
    found = set()
    for line in doc.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return found


def citations() -> list[tuple[str, str, str]]:
    """(where, doc, anchor or '') of every docs/ citation in the trees and README.md."""
    paths = [ROOT / "README.md"] + [p for t in TREES for p in sorted((ROOT / t).rglob("*"))
                                    if p.suffix in (".py", ".md", ".toml")]
    out = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for doc, first, more in CITATION.findall(line):
                where = f"{path.relative_to(ROOT)}:{number}"
                names = [first[1:]] + [m.strip(", #") for m in more.split(",") if m.strip()]
                out += [(where, doc, name) for name in names]
    return out


def test_every_cited_doc_and_section_exists():
    missing = []
    for where, doc, anchor in citations():
        path = ROOT / "docs" / doc
        if not path.exists():
            if doc not in OTHERS_WRITING:
                missing.append((where, doc))
        elif anchor and anchor not in anchors(path):
            missing.append((where, f"{doc}#{anchor}"))
    assert missing == []


def test_the_citations_are_found():
    cited = {(doc, anchor) for _, doc, anchor in citations()}
    assert ("MODEL.md", "collectives") in cited and ("PERFORMANCE.md", "") in cited


# topic pages other engineers write this session; MODEL.md links them before they land
OTHERS_WRITING = {"llama.md", "hardware.md", "exploration.md", "inputs-outputs.md"}


# ------------------------------------------------- files and names the docs cite in the code
CODE_TREES = ("simsp", "tests", "benchmarks", "scenarios", "sweeps", "examples")
TICKED = re.compile(r"`([^`\n]+)`")
SOURCE_FILE = re.compile(r"[\w./-]+\.(?:py|toml)")
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def code_files() -> dict[str, Path]:
    """The project's .py and .toml files by path from the repository root."""
    return {str(p.relative_to(ROOT)): p for t in CODE_TREES for p in (ROOT / t).rglob("*")
            if p.suffix in (".py", ".toml")}


@cache
def cited_code() -> list[tuple[str, str, list[Path], list[str]]]:
    """(doc, cited file, the project files it names, names cited right after it) for every
    backticked .py/.toml in README.md and docs/ (a path wrapped at '/' joined). A file is the
    project's where its path, or its path from simsp/, ends one of the project's; an upstream
    file whose bare name is also the project's is cited with its upstream folders."""
    files, out = code_files(), []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"/\n\s*", "/", doc.read_text())
        spans = list(TICKED.finditer(text))  # each backticked span, in order
        for i, span in enumerate(spans):
            if not SOURCE_FILE.fullmatch(span.group(1)):
                continue
            cited = span.group(1)
            found = [p for r, p in files.items() if r == cited or r.endswith("/" + cited)]
            names = []
            for prev, nxt in zip(spans[i:], spans[i + 1:]):  # `a.py` `f`, `g` ...
                name = nxt.group(1)
                if (not re.fullmatch(r",?\s*", text[prev.end():nxt.start()])
                        or SOURCE_FILE.fullmatch(name) or not NAME.fullmatch(name)):
                    break
                names.append(name)
            out.append((doc.name, cited, found, names))
    return out


def test_every_cited_project_file_exists():
    """A path from a project folder or a simsp package, backticked or not (NAME.toml: a
    placeholder), names a file that is there; examples/ left out (upstream repositories cited
    in plain text have one: deepseek-ai/DualPipe examples/example_dualpipe.py)."""
    tops = sorted({*CODE_TREES, *(p.name for p in (ROOT / "simsp").iterdir() if p.is_dir())}
                  - {"examples"})
    path = re.compile(rf"(?<![\w/.-])((?:{'|'.join(tops)})/[\w/.-]*\w\.(?:py|toml))")
    files, missing = code_files(), []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for cited in path.findall(re.sub(r"/\n\s*", "/", doc.read_text())):
            if not re.search(r"/[A-Z]+\.", cited) and not any(
                    r == cited or r.endswith("/" + cited) for r in files):
                missing.append((doc.name, cited))
    assert missing == []


def test_every_name_cited_after_a_project_file_is_in_it():
    missing = []
    for doc, cited, found, names in cited_code():
        source = "\n".join(p.read_text() for p in found) if names and found else ""
        missing += [(doc, cited, name) for name in names if found and not
                    re.search(rf"\b{re.escape(name.split('.')[-1])}\b", source)]
    assert missing == []


def test_the_cited_code_is_found():
    pairs = {(cited, name) for _, cited, found, names in cited_code() if found for name in names}
    assert {("shortcuts/ranks.py", "Ranks"), ("shortcuts/work_counts.py", "run_ranks"),
            ("engine/exchanges.py", "Exchanges._all_to_all_alone")} <= pairs
