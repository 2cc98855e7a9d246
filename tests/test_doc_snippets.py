"""Every Python snippet in README.md and docs/*.md runs as written, or says why not.

Each ```python block is run in its own process (bounded), against a reference server
started for it: its ``http://127.0.0.1:8000`` / ``ws://127.0.0.1:8000`` become that
server's address. The line just before a block may hold one HTML comment, invisible on
the rendered page, that changes how it is run:

- ``<!-- snippet: env=NAME -->``: the server runs the ``NAME`` environment (default:
  ``echo``).
- ``<!-- snippet: not-run (REASON) -->``: a fragment (it continues the page's previous
  block, or leaves out what the prose describes) or a program that needs what a test
  run has not (a GPU, a cluster, another library's services); ``REASON`` says which.

The migration guide's ``<!-- interop: CLIENT ENV -->`` blocks (OpenEnv's code beside
envlink's) are run by the interop suite (``tests/interop/test_migration_guide.py``),
against OpenEnv's servers too, and are left to it here.

Shell, YAML and other blocks are commands and configuration for a reader, not run here.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*(snippet:|interop:)\s*(.*?)\s*-->\s*$")
#: Seconds one snippet may run.
SNIPPET_TIMEOUT = 45


class Snippet(NamedTuple):
    page: str
    line: int
    code: str
    mark: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def snippets() -> list[Snippet]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            start = text.count("\n", 0, match.start())
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            kind = "" if mark is None else mark.group(1)
            text_mark = "" if mark is None else (
                mark.group(2) if kind == "snippet:" else f"interop {mark.group(2)}")
            found.append(Snippet(str(page.relative_to(ROOT)), start + 1, match.group(1),
                                 text_mark))
    return found


SNIPPETS = snippets()


def test_the_marks_are_known_and_give_their_reason() -> None:
    """A mark is one of the two forms; a snippet not run says why."""
    for snippet in SNIPPETS:
        mark = snippet.mark
        if not mark:
            continue
        assert re.fullmatch(r"env=\w+|not-run \(.{10,}\)|interop (envlink|openenv) \w+",
                            mark), (snippet.id, mark)


def test_most_snippets_run() -> None:
    """Marking a snippet not run is the exception: most run, here or in the interop
    suite."""
    not_run = [s.id for s in SNIPPETS if s.mark.startswith("not-run")]
    assert len(not_run) * 3 <= len(SNIPPETS), not_run


def _imported(code: str) -> set[str]:
    """The top-level packages a snippet imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS
                                     if not s.mark.startswith(("not-run", "interop"))],
                         ids=lambda s: s.id)
def test_snippet_runs_as_written(snippet: Snippet, tmp_path: Path) -> None:
    """The snippet runs to completion (exit status 0) against a reference server, in an
    empty working directory (what it writes stays there)."""
    # A snippet of an optional extra's page (Ray, datasets...) runs where the extra is
    # installed: the dev extra, which every run but the dependency floors' has.
    for name in sorted(_imported(snippet.code)):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{snippet.id} imports {name}, not installed here")
    env = snippet.mark.split("=", 1)[1] if snippet.mark.startswith("env=") else "echo"
    with ServerThread(env=env) as server:
        code = snippet.code.replace("http://127.0.0.1:8000", server.http_url)
        code = code.replace("ws://127.0.0.1:8000", server.url)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=SNIPPET_TIMEOUT, check=False, cwd=tmp_path,
                              stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{snippet.id}:\n{proc.stderr[-3000:]}"
