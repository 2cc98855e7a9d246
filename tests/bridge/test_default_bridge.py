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
from envlink._sync.default_bridge import DEFAULT_BRIDGE_NAME
from envlink.server import ServerThread

from .._ports import restartable_port

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
    loop thread (the default bridge's), which runs until the last of them closes."""
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
        for env in envs[:-1]:
            env.client.close()
    assert threads[0].is_alive() and envs[-1].echo("last") == "last"
    envs[-1].client.close()
    assert all(env.client.async_client.closed for env in envs)
    threads[0].join(timeout=10)
    assert not threads[0].is_alive() and _bridge_threads() == []
    assert not default_bridge().closed and default_bridge().thread is None
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


def test_the_last_close_leaves_no_envlink_thread_on_every_blocking_path() -> None:
    """Plain calls, `with`, .sync() and pool.sync() share the default bridge's one thread,
    and after the last close() no envlink thread is left (seed's examples, README)."""
    script = textwrap.dedent("""
        import threading
        import envlink
        from envlink import EchoEnv, EnvPool, GenericEnvClient
        from envlink.server import ServerThread

        def envlink_threads():
            return [t for t in threading.enumerate()
                    if t.name.startswith("envlink") and t not in before]

        with ServerThread(env="echo", max_sessions=8) as st:
            before = set(threading.enumerate())
            plain = GenericEnvClient(st.url)
            plain.reset()
            facade = GenericEnvClient(st.url).sync()
            facade.reset()
            pool = EnvPool([st.url], 2).sync()
            pool.reset()
            with EchoEnv(base_url=st.url) as env:
                env.reset()
                names = [t.name for t in envlink_threads()]
                assert len(names) == 1 and names[0].startswith("envlink-bridge-default"), names
            thread = envlink_threads()[0]
            plain.close()
            facade.close()
            assert thread.is_alive()  # the pool is still open on it
            pool.close()
            thread.join(timeout=10)
            assert envlink_threads() == [], envlink_threads()
            # The next client starts a new thread, which its close() ends again.
            again = GenericEnvClient(st.url)
            again.reset()
            assert [t.name for t in envlink_threads()] != [thread.name]
            again.close()
            assert envlink_threads() == [], envlink_threads()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


#: ``with`` forms whose connect fails on a dead port: the default bridge's facades (given
#: by .sync(), or made by a client's own ``with``) and a facade owning its bridge.
FAILED_WITH = {
    "sync-facade": "envlink.GenericEnvClient(url).sync()",
    "typed-client": "envlink.EchoEnv(base_url=url)",
    "plain-client": "envlink.GenericEnvClient(url)",
    "harness-facade": "envlink.HarnessClient(url).sync()",
}


@pytest.mark.parametrize("held", [False, True], ids=["dropped", "held"])
@pytest.mark.parametrize("form", sorted(FAILED_WITH))
def test_a_failed_with_leaves_no_envlink_thread(form: str, held: bool) -> None:
    """A connect that fails inside `with` closes what `with` opened: no envlink thread is
    left, without the garbage collector (never run here by hand), whether the caller
    still holds the object (`held`) or not."""
    made = f"made = {FAILED_WITH[form]}" if held else "made = None"
    entered = "made" if held else FAILED_WITH[form]
    script = textwrap.dedent(f"""
        import threading, time
        import envlink

        url = "http://127.0.0.1:{restartable_port()}"  # nothing listens there
        {made}
        try:
            with {entered} as env:
                raise AssertionError("connected to a dead port")
        except ConnectionError:
            pass
        # Bounded: every envlink thread is given until the deadline to end.
        deadline = time.monotonic() + 2.0
        for thread in threading.enumerate():
            if thread.name.startswith("envlink"):
                thread.join(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in threading.enumerate()
                if t.name.startswith("envlink") and t.is_alive()]
        assert left == [], left
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_facades_opened_while_the_bridge_stops_get_a_live_one() -> None:
    """Threads opening and closing facades at once (the default bridge stopping and starting
    under them): every call of every facade runs, none meets a closed loop."""
    from .test_sync_client import FakeClient

    workers, rounds = 6, 25
    start = threading.Barrier(workers)
    failures: list[BaseException] = []

    def work(n: int) -> None:
        try:
            start.wait(timeout=10)
            for i in range(rounds):
                fake = FakeClient()
                with fake.sync() as env:
                    assert env.step((n, i))["observation"] == (n, i)
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=50)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


def test_a_default_bridge_fetched_before_it_stopped_is_replaced_for_a_new_facade() -> None:
    """Integrations fetch default_bridge() and pass it to .sync(bridge): if its last facade
    closed it in between, the new facade runs on the current default bridge."""
    from .test_sync_client import FakeClient

    holder = FakeClient().sync()
    fetched = default_bridge()
    assert holder.bridge is fetched
    holder.close()  # the last facade on it, unless another test left one open
    late = FakeClient().sync(bridge=fetched)
    try:
        assert late.step(1)["observation"] == 1
        assert late.bridge is default_bridge() and not late.bridge.closed
    finally:
        late.close()
