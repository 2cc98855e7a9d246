"""An uncaught envlink error reads short: the caller's frames, where it arose, its root
cause; not the driver's, the retry loop's or the bridge's frames."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.timeout(60)

#: The issue's bound: what a person reads at a glance.
MAX_LINES = 32

PROGRAMS = {
    "sync": "GenericEnvClient(URL).sync().reset()",
    "no-await": "GenericEnvClient(URL).reset()",
    "async": """\
        import asyncio

        async def main():
            async with GenericEnvClient(URL) as env:
                await env.reset()

        asyncio.run(main())
        """,
}


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections (bound, never listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.mark.parametrize("form", sorted(PROGRAMS))
def test_an_uncaught_refused_connection_prints_a_short_traceback(
        dead_port: int, form: str) -> None:
    """A refused connection, uncaught, prints at most about 30 lines: the ConnectError with
    its root cause (the OSError), and no frame of tenacity or concurrent.futures."""
    program = (f"from envlink import GenericEnvClient\nURL = 'http://127.0.0.1:{dead_port}'\n"
               + textwrap.dedent(PROGRAMS[form]))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=50, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert "ConnectError: cannot connect to ws://127.0.0.1" in lines[-1]
    assert "ConnectionRefusedError" in done.stderr  # the root cause stays visible
    assert "tenacity" not in done.stderr and "concurrent/futures" not in done.stderr
    assert len(lines) <= MAX_LINES, done.stderr
