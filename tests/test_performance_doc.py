"""docs/performance.md: every figure names the committed command that reproduces it.

A figure is a number with a unit of measure (k or M instructions, KiB, ms, µs, a
multiplication sign, %). Every paragraph, list or table that gives one names its
command: a script under ``benchmarks/`` with its options, or the test that asserts the
figure (a table may take it from the block just before it). A section of an earlier
round says so in a paragraph that starts with "Historical" and names the commands its
figures came from, once. In "Decisions" and "Not done", whose items stand alone, every
item that gives a figure names its command itself. Every command named anywhere in
the document exists: its script is in the repository, and each ``--option`` it is
given is one its ``argparse`` parser accepts (read from the script's source, without
running it).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
BENCHMARKS = ROOT / "benchmarks"

#: A measured figure: a number and a unit.
FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?"
                    r"(?:k\b|M\b|[KMG]iB\b|ns\b|µs\b|ms\b|s\b|\u00d7|%|x\b)")
#: A benchmark script and what follows it in its code span: a command is a code span
#: that starts with the script (``python3 benchmarks/run.py --quick``), not a mention.
COMMAND = re.compile(r"`(?:python3?\s+)?(?:benchmarks/)?([a-z_]+\.py)\b([^`]*)`")
#: A test file named as the check of a figure, in a code span.
TEST = re.compile(r"(?<=`)(?:pytest )?(tests/[\w/]+\.py)\b(?=[^`]*`)")
#: A commit, as a historical section names the one its figures were measured at.
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
#: Sections whose items are checked one by one.
ITEMISED = ("## Decisions", "## Not done")


def _sections(text: str) -> list[tuple[str, str]]:
    parts = re.split(r"(?m)^(#{2,3} .*)$", text)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


@cache
def _options(script: str) -> frozenset[str]:
    """The ``--options`` a benchmark script's parser accepts, from its source."""
    tree = ast.parse((BENCHMARKS / script).read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            found |= {a.value for a in node.args
                      if isinstance(a, ast.Constant) and isinstance(a.value, str)
                      and a.value.startswith("--")}
    return frozenset(found | {"--help"})


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """``(script, options)`` for every benchmark script the text names."""
    found = []
    for match in COMMAND.finditer(text):
        script = match.group(1)
        if not (BENCHMARKS / script).exists():
            continue
        rest = match.group(2).split("#")[0]
        # Options up to the end of the span, or up to a phrase in prose after it.
        found.append((script, re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)))
    return found


def _names_a_command(text: str) -> bool:
    return bool(_commands(text)) or any((ROOT / t).exists() for t in TEST.findall(text))


def _historical(body: str) -> str | None:
    """A section's "Historical: ..." paragraph, which groups its figures under the
    commands it names (figures of an earlier round, not remeasured)."""
    found = re.search(r"(?ms)^Historical\b.*?(?=\n\s*\n|\Z)", body)
    return found.group(0) if found else None


def test_every_figure_names_its_command() -> None:
    """Each paragraph, list or table that gives a figure names the command (or test) it
    comes from; a table may take it from the paragraph just before it (its caption),
    not from another table. A section marked historical names its commands and the
    commits its figures were measured at once, in that paragraph."""
    missing = []
    for title, body in _sections(DOC.read_text(encoding="utf-8")):
        historical = _historical(body)
        if historical is not None:
            if FIGURE.search(body) and not _names_a_command(historical):
                missing.append(f"{title}: its 'Historical' paragraph names no command")
            if FIGURE.search(body) and not COMMIT.search(historical):
                missing.append(f"{title}: its 'Historical' paragraph names no commit")
            continue
        caption = False  # the paragraph just before names a command
        for block in re.split(r"\n\s*\n", body):
            table = block.lstrip().startswith("|")
            if FIGURE.search(block) and not (_names_a_command(block) or (table and caption)):
                missing.append(f"{title}: {block.strip()[:100]!r}")
            caption = not table and _names_a_command(block)
    assert not missing, missing


def test_every_item_of_decisions_and_not_done_with_a_figure_names_its_command() -> None:
    """Items that stand alone each name the command of the figures they give."""
    missing = []
    for title, body in _sections(DOC.read_text(encoding="utf-8")):
        if not title.startswith(ITEMISED):
            continue
        for item in re.split(r"(?m)^(?=- )", body):
            if FIGURE.search(item) and not _names_a_command(item):
                missing.append(f"{title}: {item[:100]!r}")
    assert not missing, missing


def test_every_named_command_exists_with_the_options_it_is_given() -> None:
    """Each benchmark command in the document: its script exists and accepts its options."""
    text = DOC.read_text(encoding="utf-8")
    commands = _commands(text)
    assert {"run.py", "instruction_guard.py", "bench_memory.py", "bench_encode.py",
            "bench_telemetry.py", "bench_first_connect.py"} <= {s for s, _ in commands}
    wrong = sorted({f"{script} {option}" for script, options in commands
                    for option in options if option not in _options(script)})
    assert not wrong, wrong
    tests = {t for t in TEST.findall(text)}
    assert all((ROOT / t).exists() for t in tests), sorted(
        t for t in tests if not (ROOT / t).exists())


@pytest.mark.parametrize(("script", "option"), [
    ("run.py", "--instructions"), ("bench_bridge.py", "--calls"),
    ("bench_journal.py", "--record-frames")])
def test_the_option_reader_sees_a_scripts_options(script: str, option: str) -> None:
    """The check reads options from the source (a self-test of the reader): an option the
    script's parser takes is found, and one it does not take is not."""
    assert option in _options(script)
    assert "--instruction" not in _options(script)
    assert option[:-1] not in _options(script)


@pytest.mark.parametrize(("text", "figure"), [
    ("took 12 ns", True), ("took 3.5 µs", True), ("took 12 ms", True), ("in 2 s,", True),
    ("in 2.5s.", True), ("12 KiB", True), ("3 MiB", True), ("1.5 GiB", True),
    ("40 %", True), ("1.2\u00d7", True), ("310 k instructions", True), ("issue 32", False),
    ("Python 3.11", False), ("2 sessions", False)])
def test_the_figure_pattern_sees_every_unit(text: str, figure: bool) -> None:
    """A number with any unit the document uses is a figure; a bare number is not."""
    assert bool(FIGURE.search(text)) is figure


@pytest.mark.parametrize(("text", "named"), [
    ("`python3 benchmarks/run.py --quick`", True), ("`run.py --only scale`", True),
    ("`tests/test_import_laziness.py`", True), ("the script run.py", False),
    ("`benchmarks/no_such_script.py`", False), ("tests/test_readme.py", False)])
def test_a_command_is_a_code_span_that_starts_with_an_existing_script(
        text: str, named: bool) -> None:
    """A mention of a script in prose is not a command; a code span of a script or a
    test that exists is."""
    assert _names_a_command(text) is named


CHANGELOG = ROOT / "CHANGELOG.md"
#: Sizes in the changelog that are settings or an incident's size, not measurements.
_NOT_MEASURED = ("100 MiB default", "256 KiB read buffer", "256 KiB buffer", "384 KiB block",
                 "14 KiB compressed message", "800 MiB", "a fixed 0.5 s", "(was 30 s)",
                 "(was 5 s", "(0.005 s … 10 s)", "600 s by default")


def test_every_changelog_figure_names_its_command_or_its_section() -> None:
    """A changelog item that gives a measured figure names its command, or the section
    of docs/performance.md that gives it with its command (and that section exists)."""
    headings = {title.lstrip("#").strip() for title, _ in _sections(
        DOC.read_text(encoding="utf-8"))}
    missing, unknown = [], []
    for item in re.split(r"(?m)^(?=- |#)", CHANGELOG.read_text(encoding="utf-8")):
        text = item
        for size in _NOT_MEASURED:
            text = text.replace(size, "")
        if not FIGURE.search(text):
            continue
        cited = re.findall(r'docs/performance\.md,\s+"([^"]+)"', " ".join(item.split()))
        unknown += [c for c in cited if not any(h.startswith(c) for h in headings)]
        if not (cited or "docs/performance.md" in item or _names_a_command(item)):
            missing.append(item.strip()[:100])
    assert not missing, missing
    assert not unknown, unknown
