"""envlink.integrations.trl: TRL's environment contract, checked without TRL installed."""

from __future__ import annotations

import asyncio
import gc
import inspect
import pickle
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from envlink import CallTimeoutError, CapacityReachedError, GenericEnvClient, ToolCallError
from envlink.integrations.trl import EnvlinkEnvironment
from envlink.server import EnvServer, ServerThread

from ._envs import AsyncEcho, Echo

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def echo_server() -> Iterator[ServerThread]:
    """An echo server with extensions, in its own thread."""
    with ServerThread(env="echo", ping_interval=None) as st:
        yield st


def counters(st: ServerThread) -> dict[str, int]:
    return dict(st.call(lambda s: s._counters.snapshot()))


def sessions(st: ServerThread, ended: int | None = None) -> int:
    """Sessions open on the server; with ``ended``, once that many have ended in all (the
    server ends a session as it handles the client's close, a moment after the client
    has moved on)."""
    if ended is not None:
        st.call(lambda s: s._counters.wait("session.destroyed", ended), timeout=30)
    return int(st.call(lambda s: len(s._registry)))


def trl_tools(cls: type) -> set[str]:
    """The tools TRL 1.16 would offer: every public plain function of the class but
    reset and get_reward (``GRPOTrainer.__init__``'s own rule)."""
    return {name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward")}


def test_only_the_subclass_tools_are_discovered() -> None:
    """TRL's discovery rule sees the user's tools and nothing of the client or the base."""
    assert trl_tools(EnvlinkEnvironment) == set()
    assert trl_tools(Echo) == {"echo", "measure", "broken"}
    assert trl_tools(AsyncEcho) == {"echo", "broken"}
    assert inspect.iscoroutinefunction(AsyncEcho.echo)
    assert inspect.iscoroutinefunction(AsyncEcho.get_reward)  # still async once wrapped


def test_construction_needs_no_arguments_and_opens_nothing(echo_server: ServerThread) -> None:
    """Building (and pickling) instances connects nowhere; the first reset does."""
    envs = [Echo(base_url=echo_server.url) for _ in range(5)]
    copies = [pickle.loads(pickle.dumps(env)) for env in envs]
    assert counters(echo_server).get("connection.opened", 0) == 0
    assert copies[0].reset() is None
    assert counters(echo_server)["connection.opened"] == 1
    del envs, copies


def test_url_from_the_environment(echo_server: ServerThread,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """ENVLINK_URL configures a class that names no server; none at all is a clear error."""
    monkeypatch.delenv("ENVLINK_URL", raising=False)
    with pytest.raises(ValueError, match="ENVLINK_URL"):
        Echo().reset()
    monkeypatch.setenv("ENVLINK_URL", echo_server.url)
    env = Echo()
    env.reset()
    assert env.echo("hi") == "hi"
    with pytest.raises(TypeError, match="unknown setting"):
        Echo(base_urll="x")


def test_reset_maps_columns_and_tools_step(echo_server: ServerThread) -> None:
    """reset(**row) passes the mapped columns; tools step the server; get_reward reads it."""

    class Mapped(Echo):
        def _reset_kwargs(self, row: Any) -> dict[str, Any]:
            return {"episode_id": f"task-{row['task']}"}

        def _observation(self, result: Any, row: Any) -> str:
            return f" [{result.observation['echoed_message']}]"

    env = Mapped(base_url=echo_server.url)
    row = {"prompt": [{"role": "user", "content": "x"}], "task": 7}
    assert env.reset(**row) == " [Echo environment ready!]"
    assert env.client.state()["episode_id"] == "task-7"
    assert env.echo("abc") == "abc"
    assert env.measure("abcd") == 4
    assert env.get_reward() == 2.0
    assert counters(echo_server)["applied.step"] == 2


def test_tool_errors_are_raised_with_their_reason(echo_server: ServerThread) -> None:
    """An environment's tool error is a ToolCallError whose text TRL records, never a string."""
    env = Echo(base_url=echo_server.url)
    env.reset()
    with pytest.raises(ToolCallError) as info:
        env.broken("x")
    assert "no_such_tool" in str(info.value)
    assert info.value.tool_name == "no_such_tool"


def test_async_tools_run_on_a_foreign_loop(echo_server: ServerThread) -> None:
    """async tools await on the caller's loop (TRL's daemon loop) and raise, never return a
    coroutine; gathered calls all complete."""
    env = AsyncEcho(base_url=echo_server.url)
    env.reset()

    async def rollout() -> list[Any]:
        return await asyncio.gather(env.echo("a"), env.echo("b"), env.broken("c"),
                                    return_exceptions=True)

    results = asyncio.run(rollout())
    assert results[:2] == ["a", "b"]
    assert isinstance(results[2], ToolCallError)
    assert asyncio.run(env.get_reward()) == 1.0


def test_reset_survives_a_dropped_connection(echo_server: ServerThread) -> None:
    """A connection dropped under a reset (after the server applied it) is reopened and the
    reset completes: the blip never reaches TRL."""
    env = Echo(base_url=echo_server.url)
    env.reset()
    env.echo("one")

    def arm(server: EnvServer) -> None:
        server.faults.drop_after = 3  # this connection's next request: the second reset
        server.faults.drop_mode = "after_apply"

    echo_server.call(arm)
    assert env.reset() is None
    assert env.echo("two") == "two"
    seen = counters(echo_server)
    assert seen["drop"] == 1
    assert seen["applied.reset"] >= 2


def test_reset_waits_for_a_full_server(echo_server: ServerThread) -> None:
    """At capacity, reset waits (backing off under the retry budget) until a session frees."""
    echo_server.call(lambda s: setattr(s, "max_sessions", 1))
    holder = GenericEnvClient(echo_server.url).sync()
    holder.reset()
    env = Echo(base_url=echo_server.url, reset_timeout=30)
    done = threading.Event()
    errors: list[BaseException] = []

    def reset() -> None:
        try:
            env.reset()
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=reset)
    worker.start()
    # The env's first try reached the server (and was refused): now free the slot.
    echo_server.call(lambda s: s._counters.wait("connection.opened", 2))
    assert not done.is_set()
    holder.close()
    worker.join(30)
    assert not errors, errors
    assert env.echo("in") == "in"


def test_reset_gives_up_at_its_deadline(echo_server: ServerThread) -> None:
    """A server that stays full ends the wait with a typed error at reset_timeout."""
    echo_server.call(lambda s: setattr(s, "max_sessions", 0))
    env = Echo(base_url=echo_server.url, reset_timeout=0.5)
    # The typed error of the wait that hit the deadline: the server's refusal, or the
    # reset's own deadline when the wait was still queued.
    with pytest.raises((CapacityReachedError, CallTimeoutError)):
        env.reset()


def test_sessions_are_released_when_dropped_or_scored(echo_server: ServerThread) -> None:
    """A garbage-collected instance ends its session; "release" mode ends it after get_reward
    and the next reset opens a new one."""
    env = Echo(base_url=echo_server.url)
    env.reset()
    assert sessions(echo_server) == 1
    del env
    gc.collect()
    assert sessions(echo_server, ended=1) == 0

    env = Echo(base_url=echo_server.url, session_mode="release")
    env.reset()
    env.echo("x")
    assert env.get_reward() == 1.0
    assert sessions(echo_server, ended=2) == 0
    env.reset()
    assert sessions(echo_server) == 1
    env._release()
    assert sessions(echo_server, ended=3) == 0


def test_instances_share_one_loop_thread(echo_server: ServerThread) -> None:
    """Many instances (a TRL pool) run on one loop thread."""
    before = {t.name for t in threading.enumerate()}
    envs = [Echo(base_url=echo_server.url) for _ in range(32)]
    for env in envs:
        env.reset()
    new = {t.name for t in threading.enumerate()} - before
    assert len({name for name in new if name.startswith("envlink")}) <= 1, new
    assert len({id(env.client.bridge) for env in envs}) == 1
    assert sessions(echo_server) == 32
    del envs, env
    gc.collect()
    assert sessions(echo_server, ended=32) == 0


def test_a_release_inside_a_running_loop_closes_before_the_bridge(echo_server: ServerThread
                                                                 ) -> None:
    """The last instance on the default bridge, dropped inside running async code, still
    ends its sessions on the wire: the bridge outlives the close handed to its loop."""
    env = Echo(base_url=echo_server.url)
    env.reset()
    client = env.client
    # A second session, closed with the first: the close then awaits before any frame
    # goes out, which a loop stopped under it would never let happen.
    client.bridge.call(client.async_client.new_session, timeout=30)
    assert sessions(echo_server) == 2
    del client

    async def drop() -> None:
        nonlocal env
        del env
        gc.collect()

    asyncio.run(drop())
    assert sessions(echo_server, ended=2) == 0
