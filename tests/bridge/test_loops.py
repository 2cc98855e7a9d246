"""The loops envlink makes for itself run on uvloop where it is installed (unless
ENVLINK_LOOP=asyncio); a loop the application runs is never replaced, and every fast
path that reads asyncio's internals agrees with the public API on uvloop too."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from envlink import GenericEnvClient, InvalidArgumentError, _speedups
from envlink._bridge import Bridge
from envlink._bridge import loops as _loops
from envlink.server import ServerThread

uvloop = pytest.importorskip("uvloop")

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _no_loop_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_loops.LOOP_VARIABLE, raising=False)


def _bridge_loop_name() -> str:
    bridge = Bridge()
    try:
        async def running() -> str:
            return _loops.loop_name(asyncio.get_running_loop())

        return bridge.call(running, timeout=10)
    finally:
        bridge.close()


def test_the_bridge_runs_uvloop() -> None:
    """The bridge's loop thread runs a uvloop loop when uvloop is installed."""
    assert _bridge_loop_name() == "uvloop"


def test_the_variable_turns_uvloop_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """ENVLINK_LOOP=asyncio: the bridge's loop is asyncio's own; a bad value is refused."""
    monkeypatch.setenv(_loops.LOOP_VARIABLE, "asyncio")
    assert _bridge_loop_name() == "asyncio"
    monkeypatch.setenv(_loops.LOOP_VARIABLE, "trio")
    with pytest.raises(InvalidArgumentError, match="ENVLINK_LOOP"):
        _loops.loop_factory()


def test_run_is_envlinks_cli_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """_loops.run (what `envlink serve` runs on): uvloop, or asyncio's with the variable."""
    async def name() -> str:
        return _loops.loop_name(asyncio.get_running_loop())

    assert _loops.run(name()) == "uvloop"
    monkeypatch.setenv(_loops.LOOP_VARIABLE, "asyncio")
    assert _loops.run(name()) == "asyncio"


def test_a_users_loop_is_never_replaced() -> None:
    """An application's asyncio.run stays on asyncio's loop while a sync client (on a
    uvloop bridge) works beside it, and the event loop policy is left alone."""
    policy = type(asyncio.get_event_loop_policy())
    with ServerThread(env="echo") as st:
        sync = GenericEnvClient(st.url).sync()
        try:
            sync.reset()

            async def main() -> str:
                async with GenericEnvClient(st.url) as env:
                    await env.reset()
                return _loops.loop_name(asyncio.get_running_loop())

            assert asyncio.run(main()) == "asyncio"
            assert sync.step({"message": "x"}).observation["echoed_message"] == "x"
        finally:
            sync.close()
    assert type(asyncio.get_event_loop_policy()) is policy


def test_the_fast_paths_agree_with_asyncio_on_uvloop() -> None:
    """On a uvloop loop: the running-loop getter, the current-task look-up and the lock
    turns give what asyncio's public functions give."""
    async def check() -> None:
        loop = asyncio.get_running_loop()
        assert _speedups.running_loop_getter()() is loop
        assert _speedups.task_of_loop_getter()(loop) is asyncio.current_task()
        take, give = _speedups.lock_turns()
        lock = asyncio.Lock()
        if not take(lock):  # the public fallback (ENVLINK_NO_SPEEDUPS) never takes it
            assert not _speedups.lock_fast_path()
            await lock.acquire()
        assert lock.locked()
        waiter = asyncio.ensure_future(lock.acquire())
        await asyncio.sleep(0)
        assert not take(lock)  # held: the waiter queues
        give(lock)
        await asyncio.wait_for(waiter, 5)
        assert lock.locked()
        lock.release()

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(check())
    finally:
        loop.close()


async def test_a_client_on_a_uvloop_loop_keeps_its_deadlines() -> None:
    """A client on a uvloop loop of the application's: calls answer, a deadline fires."""
    async def main() -> None:
        from envlink import CallTimeoutError
        from envlink.server import EnvServer as Srv

        async with Srv(env="echo", ping_interval=None) as srv, \
                GenericEnvClient(srv.url) as env:
            await env.reset()
            srv.faults.latency = 1.0
            with pytest.raises(CallTimeoutError):
                await env.step({"message": "late"}, timeout=0.2)

    await asyncio.get_running_loop().run_in_executor(None, uvloop.run, main())


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
@pytest.mark.parametrize(("variable", "expected"), [(None, True), ("asyncio", False)])
def test_envlink_serve_runs_uvloop_unless_told(variable: str | None, expected: bool) -> None:
    """`envlink serve` loads uvloop (its loop) by default, and not with ENVLINK_LOOP=asyncio."""
    from tests.server._server_support import ServeProcess

    env = {} if variable is None else {_loops.LOOP_VARIABLE: variable}
    proc = ServeProcess("--port", "0", env=env)
    try:
        maps = Path(f"/proc/{proc.proc.pid}/maps").read_text()
        assert ("uvloop" in maps) is expected
    finally:
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.communicate(timeout=10)
