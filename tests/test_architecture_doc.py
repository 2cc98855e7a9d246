"""docs/architecture.md's guarantee tables point at real modules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "envlink"
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
#: Every `path.py` written in the doc's tables (the Owner and Where columns).
TABLE_ROWS = [line for line in DOC.splitlines() if line.startswith("| ")]
NAMED = {name for line in TABLE_ROWS for name in re.findall(r"`([\w/]+\.py)`", line)
         if not name.startswith("tests/")}


def test_every_module_the_tables_name_exists() -> None:
    """Each module a guarantee is assigned to is a module of src/envlink."""
    assert NAMED
    missing = sorted(n for n in NAMED if not (SRC / n).is_file())
    assert missing == []



def test_every_library_module_owns_a_guarantee() -> None:
    """Each module of the library (outside the server, whose private modules the server
    table groups) is named in a table: none is left out of the map."""
    modules = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
               if p.name not in {"__init__.py", "__main__.py"} and p.parts[-2] != "server"
               and "server" not in p.relative_to(SRC).parts}
    assert modules
    assert sorted(modules - NAMED) == []


def test_the_import_graph_lists_what_the_bridge_imports() -> None:
    """The graph's ``_bridge →`` line names exactly the envlink modules outside the bridge
    that its modules import (at run time or for type checking)."""
    (line,) = [x for x in DOC.splitlines() if x.strip().startswith("_bridge ")]
    listed = set(re.findall(r"(_\w+)", line.split("→", 1)[1].split(" only")[0]))
    imported = set()
    for path in (SRC / "_bridge").glob("*.py"):
        for module in re.findall(r"^\s*(?:from|import) envlink\.(\w+)", path.read_text(),
                                 re.MULTILINE):
            if module != "_bridge":
                imported.add(module)
    assert listed == imported
