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
#: The servers the guide tells the reader to start: (port, environment).
SERVERS = re.findall(r"^envlink serve --port (\d+) --env (\w+)$",
                     "\n".join(re.findall(r"```sh\n(.*?)\n```", DOC, re.S)), re.M)


def test_the_guide_has_a_sync_and_an_async_example() -> None:
    """The guide shows the training loop both ways."""
    assert len(EXAMPLES) == 2
    assert ".sync()" in EXAMPLES[0] and "asyncio.run" in EXAMPLES[1]


def test_the_guide_says_which_servers_to_start() -> None:
    """The guide names the two servers its examples use (ports 8000 and 8001), and the
    environment whose actions its examples send."""
    assert SERVERS == [("8000", "deterministic"), ("8001", "deterministic")]
    assert all('{"move": 1}' in example for example in EXAMPLES)


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_pool_guide_examples_run(index: int) -> None:
    """Each example runs in its own process against the servers the guide says to start,
    and every step it sends is applied (none answered an error)."""
    code = EXAMPLES[index]
    (_, env_a), (_, env_b) = SERVERS
    with ServerThread(env=env_a) as a, ServerThread(env=env_b) as b:
        code = code.replace("http://127.0.0.1:8000", a.http_url)
        code = code.replace("http://127.0.0.1:8001", b.http_url)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=45, check=False)
        assert proc.returncode == 0, proc.stderr
        for server in (a, b):
            # Both servers took sessions (the pool spread them) and applied every step.
            assert server.call(lambda s: s.connections_opened) > 0
            sent = server.call(lambda s: s.counter("request.step"))
            assert sent > 0
            assert server.call(lambda s: s.counter("applied.step")) == sent
