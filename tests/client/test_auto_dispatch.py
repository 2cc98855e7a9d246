"""Calls without await (OpenEnv 0.10's dispatch) against the real reference server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import warnings
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from envlink import (
    CallFinished,
    CallStarted,
    CallTimeoutError,
    ClientHook,
    EchoEnv,
    EnvClient,
    ExecutionModeError,
    GenericEnvClient,
    StepResult,
    SyncEnvClient,
    default_bridge,
)
from envlink._sync.default_bridge import DEFAULT_BRIDGE_NAME
from envlink.server import ServerThread

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(60)


def _envlink_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("envlink")}


class _Threads(ClientHook):
    """Records the thread each call runs in."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def call_started(self, call: CallStarted) -> Any:
        self.names.append(threading.current_thread().name)

    def call_finished(self, call: CallFinished, token: Any) -> None:
        pass


def test_plain_calls_block_and_return_results(server_thread: ServerThread) -> None:
    """In plain code reset/step/state return results (not coroutines), on the process's
    default bridge (as .sync()), and close() closes the client, leaving no thread of its
    own."""
    before = _envlink_threads()
    env = GenericEnvClient(base_url=server_thread.url)
    result = env.reset()
    assert isinstance(result, StepResult)
    assert result.observation["echoed_message"] == "Echo environment ready!"
    assert env.step({"message": "hi"}).observation["echoed_message"] == "hi"
    assert env.state()["step_count"] == 1
    assert env.connect() is env
    assert env._envlink_auto is not None
    assert env._envlink_auto.bridge is default_bridge()
    env.close()
    assert env.closed
    assert {t.name for t in _envlink_threads() - before} <= {
        t.name for t in _envlink_threads() if t.name.startswith(DEFAULT_BRIDGE_NAME)}


def test_with_block_is_sync_mode(server_thread: ServerThread) -> None:
    """`with EnvClient(...) as env` connects at entry, makes blocking calls, closes at exit."""
    with EchoEnv(base_url=server_thread.url) as env:
        assert env.connected
        env.reset()
        assert env.call_tool("echo_message", message="hello") == "hello"
        assert env.list_tools()
    assert env.closed


def test_awaited_calls_claim_async_mode(server_thread: ServerThread) -> None:
    """Awaited, the methods behave as before (the first awaited call claims async mode,
    create_task accepts a first call), and `with` on that client is refused."""

    async def main() -> None:
        env = GenericEnvClient(base_url=server_thread.url)
        first = asyncio.create_task(env.reset())
        assert (await first).observation["echoed_message"] == "Echo environment ready!"
        assert (await env.step({"message": "a"})).observation["echoed_message"] == "a"
        assert env._execution_mode == "async"
        with pytest.raises(ExecutionModeError, match="async mode"), env:
            pass
        await env.close()

    asyncio.run(main())


def test_plain_call_inside_a_running_loop_resolves_on_use(server_thread: ServerThread) -> None:
    """Inside a running loop, an un-awaited call's result is used like the result (attribute,
    bool, str, repr, indexing), running on the bridge's loop thread, not the caller's."""
    threads = _Threads()

    async def main() -> None:
        env = GenericEnvClient(base_url=server_thread.url, hooks=[threads])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            result = env.reset()
            assert result.observation["echoed_message"] == "Echo environment ready!"
            step = env.step({"message": "tool output"})
            assert "tool output" in str(step)
            assert repr(step).startswith("StepResult(")
            assert bool(step)
            state = env.state()
            assert state["step_count"] == 1
            assert isinstance(env.reset(), StepResult)  # sync mode now: the result itself
            with pytest.raises(ExecutionModeError, match="sync mode"):
                async with env:
                    pass
            env.close()

    asyncio.run(main())
    assert threads.names
    assert all(name.startswith("envlink-bridge") for name in threads.names), threads.names


def test_blocking_inside_a_loop_warns_once_per_client(server_thread: ServerThread,
                                                      otel: Otel) -> None:
    """Several blocking calls inside one running loop give one RuntimeWarning, not one each
    (a client with providers of its own runs on a bridge of its own, so the warning is
    this client's)."""

    async def main() -> list[warnings.WarningMessage]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env = GenericEnvClient(base_url=server_thread.url, tracer_provider=otel.tracer_provider,
                                   meter_provider=otel.meter_provider)
            env.reset().observation  # noqa: B018 - resolving is the point
            for n in range(3):
                env.step({"message": str(n)}).observation  # noqa: B018
            env.close()
        return [w for w in caught if issubclass(w.category, RuntimeWarning)]

    caught = asyncio.run(main())
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "blocks that loop" in str(caught[0].message)


def test_an_unused_result_warns_that_the_call_did_not_run(server_thread: ServerThread) -> None:
    """A call inside a loop whose result is neither awaited nor used does not run, and a
    RuntimeWarning says so (as Python's "coroutine was never awaited")."""

    async def main() -> None:
        env = GenericEnvClient(base_url=server_thread.url)
        with pytest.warns(RuntimeWarning, match=r"step\(\) was called .* did not run"):
            env.step({"message": "lost"})
        assert env._execution_mode is None
        await env.close()

    asyncio.run(main())


def test_result_used_after_another_was_awaited_is_refused(server_thread: ServerThread) -> None:
    """Mixing on one client: an un-awaited result used after an await is an
    ExecutionModeError, and the call is not made."""

    async def main() -> None:
        env = GenericEnvClient(base_url=server_thread.url)
        pending = env.state()
        await env.reset()
        with pytest.raises(ExecutionModeError):
            pending.step_count  # noqa: B018
        with pytest.raises(ExecutionModeError):  # kept: not retried
            str(pending)
        await env.close()

    asyncio.run(main())


def test_async_client_handed_to_plain_code_after_its_loop_ended(
        server_thread: ServerThread) -> None:
    """As in OpenEnv: a client used under asyncio.run(...) then called from plain code
    continues in sync mode (a fresh session on the bridge)."""
    env = GenericEnvClient(base_url=server_thread.url)

    async def main() -> None:
        await env.reset()

    asyncio.run(main())
    assert env.reset().observation["echoed_message"] == "Echo environment ready!"
    assert env._execution_mode == "sync"
    env.close()


def test_plain_call_deadline_and_context(server_thread: ServerThread, otel: Otel) -> None:
    """A plain call has the client's deadline (CallTimeoutError, client still usable) and
    its client span is a child of the caller's current span."""
    env = GenericEnvClient(base_url=server_thread.url, tracer_provider=otel.tracer_provider,
                           meter_provider=otel.meter_provider)
    try:
        env.reset()
        server_thread.call(lambda s: setattr(s.faults, "latency", 2.0))
        try:
            with pytest.raises(CallTimeoutError):
                env.step({"message": "slow"}, timeout=0.2)
        finally:
            server_thread.call(lambda s: setattr(s.faults, "latency", 0.0))
        tracer = otel.tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("caller") as caller:
            env.reset()
        assert trace.get_current_span() is not caller
    finally:
        env.close()
    resets = [s for s in otel.spans() if s.name == "reset" and s.kind is SpanKind.CLIENT]
    assert resets[-1].parent is not None
    assert resets[-1].parent.span_id == caller.get_span_context().span_id


def test_plain_new_session_children(server_thread: ServerThread) -> None:
    """In sync mode new_session() gives a blocking child with its own episode, closed with
    the parent."""
    env = GenericEnvClient(base_url=server_thread.url)
    env.reset()
    env.step({"message": "parent"})
    child = env.new_session()
    assert isinstance(child, SyncEnvClient)
    child.reset()
    assert child.state()["step_count"] == 0
    assert env.state()["step_count"] == 1
    env.close()
    assert child.async_client.closed


class _Shouting(EnvClient[dict[str, Any], dict[str, Any], dict[str, Any]]):
    """A typed client overriding step(), as users' clients do."""

    async def step(self, action: dict[str, Any], **kwargs: Any) -> StepResult[dict[str, Any]]:
        return await super().step({"message": str(action["message"]).upper()}, **kwargs)


def test_typed_client_overrides_dispatch_too(server_thread: ServerThread) -> None:
    """A subclass's own step() override works in plain code and awaited."""
    with _Shouting(base_url=server_thread.url) as env:
        env.reset()
        assert env.step({"message": "hi"}).observation["echoed_message"] == "HI"

    async def main() -> None:
        async with _Shouting(base_url=server_thread.url) as env:
            await env.reset()
            assert (await env.step({"message": "yo"})).observation["echoed_message"] == "YO"

    asyncio.run(main())


def test_sync_facade_claims_blocking_use(server_thread: ServerThread) -> None:
    """.sync() keeps working beside the dispatch; its first call locks the client to
    blocking use (as OpenEnv's facade does), not creating the facade alone."""
    client = EchoEnv(base_url=server_thread.url)
    facade = client.sync()
    assert client._execution_mode is None
    with facade as env:
        env.reset()
        assert client._execution_mode == "sync"
        assert env.call_tool("echo_message", message="x") == "x"
        assert env.list_tools()


@pytest.mark.parametrize("locked_by", ["plain call", "sync facade"])
def test_a_blocking_client_inside_a_running_loop_returns_real_results(
        server_thread: ServerThread, locked_by: str) -> None:
    """A client locked to blocking use, called without await inside a running loop (a
    notebook, sync library code under async code), blocks and returns the StepResult
    itself; the work runs on the bridge's thread, so the caller's loop cannot deadlock."""
    client = GenericEnvClient(base_url=server_thread.url)
    facade = client.sync()
    if locked_by == "plain call":
        client.reset()
    else:
        facade.reset()

    async def main() -> tuple[Any, Any, Any]:
        ticks = 0

        async def tick() -> None:  # the caller's loop: blocked during the call, not broken
            nonlocal ticks
            ticks += 1

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            result = client.step({"message": "in a loop"})
            state = client.state()
        await tick()
        return result, state, ticks

    result, state, ticks = asyncio.run(main())
    assert type(result) is StepResult and isinstance(result, StepResult)
    assert result.observation["echoed_message"] == "in a loop"
    assert isinstance(state, dict) and state["step_count"] >= 1 and ticks == 1
    client.close()
    facade.close()


def test_awaited_path_makes_no_dispatch_objects(server_thread: ServerThread) -> None:
    """Once in async mode, an awaited step goes straight to its coroutine: no dispatch
    function and no AutoResult is called (profiled call counts)."""
    from envlink._bridge import dispatch

    # Code objects, not qualified names, which Python 3.10's code objects do not carry.
    watched = {GenericEnvClient.step.__code__: "dispatched.<locals>.method",
               dispatch._dispatch.__code__: "_dispatch",
               dispatch.AutoResult.__init__.__code__: "AutoResult.__init__"}
    calls: dict[str, int] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in watched:
            name = watched[frame.f_code]
            calls[name] = calls.get(name, 0) + 1

    async def main() -> None:
        env = GenericEnvClient(base_url=server_thread.url)
        await env.reset()
        sys.setprofile(profile)
        try:
            for n in range(10):
                await env.step({"message": str(n)})
        finally:
            sys.setprofile(None)
        await env.close()

    asyncio.run(main())
    assert calls.get("dispatched.<locals>.method") == 10
    assert "_dispatch" not in calls
    assert "AutoResult.__init__" not in calls


_CLOSE_IN_ASYNCIO_RUN = """
import asyncio, sys
from envlink import GenericEnvClient
async def main(url):
    env = GenericEnvClient(base_url=url)
    env.reset().observation
    env.close()
asyncio.run(main(sys.argv[1]))
"""


def test_no_stray_async_generator_after_close_in_asyncio_run(
        server_thread: ServerThread) -> None:
    """A blocking client closed inside asyncio.run(...) leaves no async generator to be
    finalised after a loop's shutdown_asyncgens() (Python warned about envlink's)."""
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "always", "-c", _CLOSE_IN_ASYNCIO_RUN,
         server_thread.url], capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 0, done.stderr
    assert "shutdown_asyncgens" not in done.stderr, done.stderr


def _calls_in_both_threads(bridge: Any, fn: Any) -> list[tuple[str, str]]:
    """(module file, function name) of each Python function ``fn()`` calls, in this
    thread and on ``bridge``'s loop thread, from the call's start to its end: once per
    call (a coroutine resumed is not called again)."""
    frames: list[Any] = []  # kept alive, so that no two calls share an id

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            frames.append(frame)

    async def watch_loop() -> None:
        sys.setprofile(profile)

    async def unwatch_loop() -> None:
        sys.setprofile(None)

    bridge.call(watch_loop, timeout=10.0)
    try:
        sys.setprofile(profile)
        try:
            fn()
        finally:
            sys.setprofile(None)
    finally:
        bridge.call(unwatch_loop, timeout=10.0)
    once = {id(frame): frame for frame in frames}.values()
    return [(frame.f_code.co_filename.replace("\\", "/"), frame.f_code.co_name)
            for frame in once]


@pytest.mark.parametrize("how", ["sync facade", "plain call"])
def test_a_blocking_step_with_a_timeout_visits_each_layer_once(
        server_thread: ServerThread, how: str) -> None:
    """A blocking step(timeout=), through client.sync() or a plain call, takes the one way
    in and visits each layer once, end to end: one blocking_call, one check of the timeout
    (in the caller's thread: the client on the loop takes the checked value as it is), one
    deadline (call_deadline), one bridged call, one client step, one driver call."""
    client = GenericEnvClient(base_url=server_thread.url)
    env: Any = client.sync() if how == "sync facade" else client
    try:
        env.reset()
        seen = _calls_in_both_threads(default_bridge(),
                                      lambda: env.step({"message": "hi"}, timeout=5.0))
        names = [name for _, name in seen]
        assert names.count("blocking_call") == 1
        assert names.count("check_timeout") == 1
        assert names.count("call_deadline") == 1
        # One bridged call: the facades enter Bridge.call's implementation directly.
        assert [n for path, n in seen if path.endswith("_bridge/bridge.py")].count(
            "_call_packed") == 1
        assert [n for path, n in seen if path.endswith("_client/client.py")].count("step") == 1
        assert [n for path, n in seen if path.endswith("_client/driver.py")].count("call") == 1
    finally:
        env.close()
