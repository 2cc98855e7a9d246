"""docs/pool.md's examples run as written against two reference servers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(60)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "pool.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)\n```", DOC, re.S)


def test_the_guide_has_a_sync_and_an_async_example() -> None:
    """The guide shows the training loop both ways."""
    assert len(EXAMPLES) == 2
    assert ".sync()" in EXAMPLES[0] and "asyncio.run" in EXAMPLES[1]


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_pool_guide_examples_run(index: int) -> None:
    """Each example runs in its own process against two deterministic servers."""
    code = EXAMPLES[index]
    with ServerThread(env="deterministic") as a, ServerThread(env="deterministic") as b:
        code = code.replace("http://127.0.0.1:8000", a.http_url)
        code = code.replace("http://127.0.0.1:8001", b.http_url)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=45, check=False)
        assert proc.returncode == 0, proc.stderr
        # Both servers took sessions: the pool spread them.
        assert a.call(lambda s: s.connections_opened) > 0
        assert b.call(lambda s: s.connections_opened) > 0
