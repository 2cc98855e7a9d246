"""The process-wide default bridge: one loop thread for every sync client not given one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from envlink import Bridge, GenericEnvClient, default_bridge
from envlink._client.default_bridge import DEFAULT_BRIDGE_NAME
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(120)

INSTANCES = 256


def _bridge_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("envlink-bridge")]


class TrlStyleEnv:
    """Shaped like a TRL ``environment_factory`` class: it holds its own sync client."""

    url = ""

    def __init__(self) -> None:
        self.client = GenericEnvClient(self.url).sync()

    def reset(self, **row: Any) -> str:
        return str(self.client.reset(**row).observation["echoed_message"])

    def echo(self, message: str) -> str:
        """Echo a message.

        Args:
            message: the text to echo.
        """
        return str(self.client.step({"message": message}).observation["echoed_message"])


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with ServerThread(env="echo", max_sessions=INSTANCES + 8) as st:
        yield st


def test_256_trl_style_instances_share_one_loop_thread(server: ServerThread) -> None:
    """256 instances, each holding its own EnvClient(...).sync(), run their sessions on one
    loop thread (the default bridge's), and closing them leaves that bridge running."""
    TrlStyleEnv.url = server.url
    envs = [TrlStyleEnv() for _ in range(INSTANCES)]
    try:
        for i, env in enumerate(envs):
            env.reset()
            assert env.echo(f"m{i}") == f"m{i}"
        threads = _bridge_threads()
        assert [t.name.startswith(DEFAULT_BRIDGE_NAME) for t in threads] == [True]
        assert {env.client.bridge for env in envs} == {default_bridge()}
        assert server.call(lambda srv: len(srv.sessions())) == INSTANCES
    finally:
        for env in envs:
            env.client.close()
    assert all(env.client.async_client.closed for env in envs)
    assert not default_bridge().closed
    assert default_bridge().thread is threads[0]
    server.call(lambda srv: srv.wait_for("session.destroyed", INSTANCES), timeout=20)
    assert server.call(lambda srv: len(srv.sessions())) == 0


def test_a_bridge_of_your_own_opts_out(server: ServerThread) -> None:
    """A client given its own bridge runs on it, and its close() leaves that bridge open."""
    with Bridge(name="envlink-bridge-mine") as mine:
        env = GenericEnvClient(server.url).sync(bridge=mine)
        env.reset()
        assert env.bridge is mine
        env.close()
        assert not mine.closed


def test_a_closed_default_bridge_is_replaced() -> None:
    """Closing the default bridge by hand is allowed: the next default_bridge() is new."""
    script = textwrap.dedent("""
        import envlink
        first = envlink.default_bridge()
        assert envlink.default_bridge() is first
        first.close()
        second = envlink.default_bridge()
        assert second is not first and not second.closed
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_default_bridge_is_closed_at_exit_and_fresh_after_fork() -> None:
    """A forked child's first call on the default bridge starts a fresh loop thread (never the
    parent's), and a program that never closes its sync client exits cleanly."""
    script = textwrap.dedent("""
        import asyncio, os, sys, threading
        import envlink
        from envlink import GenericEnvClient
        from envlink.server import ServerThread

        async def where():
            return threading.get_ident(), id(asyncio.get_running_loop())

        st = ServerThread(env="echo").__enter__()
        env = GenericEnvClient(st.url).sync()
        env.reset()
        parent = envlink.default_bridge().call(where, timeout=5)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                bridge = envlink.default_bridge()
                thread, loop = bridge.call(where, timeout=5)
                if loop != parent[1] and bridge.thread.ident == thread:
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "child"
        assert env.step({"message": "after fork"}).observation["echoed_message"] == "after fork"
        st.__exit__(None, None, None)
        # env is never closed: the atexit hook closes the default bridge.
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
