"""SyncEnvClient against the real reference server on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry.trace import SpanKind

from envlink import Bridge, CallTimeoutError, EchoEnv, GenericEnvClient, set_testing
from envlink.names import METRIC_BRIDGE_CALL_DURATION
from envlink.server import ServerThread

from .._otel_support import Otel
from .conftest import envlink_threads

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _no_backoff_waits() -> Iterator[None]:
    with set_testing():
        yield


def test_echo_episode_through_the_sync_facade(server_thread: ServerThread) -> None:
    """reset/step/state and a bridged extra coroutine method (call_tool) work end to end, and
    closing leaves no bridge thread behind."""
    before = envlink_threads()
    with EchoEnv(base_url=server_thread.url).sync() as env:
        assert env.async_client.connected
        reset = env.reset()
        assert reset.observation.echoed_message == "Echo environment ready!"
        assert env.call_tool("echo_message", message="hi") == "hi"
        assert env.state()["step_count"] == 1
    assert envlink_threads() - before == set()


def test_generic_client_dict_actions(server_thread: ServerThread) -> None:
    """GenericEnvClient(...).sync() steps with plain dict actions."""
    env = GenericEnvClient(base_url=server_thread.url).sync()
    try:
        env.reset()
        result = env.step({"message": "plain"})
        assert result.observation["echoed_message"] == "plain"
    finally:
        env.close()


def test_client_deadline_fires_before_the_bridge(server_thread: ServerThread) -> None:
    """With a slow server, timeout= is the client's own deadline (its CallTimeoutError, not
    the bridge's), and the facade stays usable afterwards."""
    env = GenericEnvClient(base_url=server_thread.url).sync()
    try:
        env.reset()
        server_thread.call(lambda s: setattr(s.faults, "latency", 1.0))
        try:
            with pytest.raises(CallTimeoutError) as info:
                env.step({"message": "slow"}, timeout=0.3)
        finally:
            server_thread.call(lambda s: setattr(s.faults, "latency", 0.0))
        assert "bridged call" not in str(info.value)
        env.reset()
        assert env.step({"message": "again"}).observation["echoed_message"] == "again"
    finally:
        env.close()


def test_traces_nest_caller_bridge_client(server_thread: ServerThread, otel: Otel) -> None:
    """With nested_spans: the caller's span is the parent of the bridge span, itself the parent
    of the client's CLIENT span; the bridge histogram is recorded."""
    tp = otel.tracer_provider
    env = GenericEnvClient(base_url=server_thread.url, tracer_provider=tp,
                           meter_provider=otel.meter_provider).sync(nested_spans=True)
    try:
        with tp.get_tracer("test").start_as_current_span("handler") as handler:
            env.reset()
    finally:
        env.close()
    spans = otel.spans()
    hop = next(s for s in spans if s.name == "envlink.bridge reset")
    client = next(s for s in spans if s.name == "reset" and s.kind is SpanKind.CLIENT)
    assert hop.parent is not None
    assert hop.parent.span_id == handler.get_span_context().span_id
    assert client.parent is not None
    assert client.parent.span_id == hop.context.span_id
    assert METRIC_BRIDGE_CALL_DURATION in {m.name for m in otel.metrics()}


def test_one_span_per_sync_call_by_default(server_thread: ServerThread, otel: Otel) -> None:
    """By default a sync call has one span, the client's: child of the caller's span, started
    before the hop (it covers the queue wait, shown as an attribute); only the bridge's wait
    histogram is recorded, and one call-duration record per call."""
    tp = otel.tracer_provider
    env = GenericEnvClient(base_url=server_thread.url, tracer_provider=tp,
                           meter_provider=otel.meter_provider).sync()
    try:
        with tp.get_tracer("test").start_as_current_span("handler") as handler:
            env.reset()
            env.step({"message": "hi"})
    finally:
        env.close()
    spans = otel.spans()
    assert not [s for s in spans if s.name in ("envlink.bridge reset", "envlink.bridge step")]
    for method in ("reset", "step"):
        (client,) = [s for s in spans if s.name == method and s.kind is SpanKind.CLIENT]
        assert client.parent is not None
        assert client.parent.span_id == handler.get_span_context().span_id
        wait = (client.attributes or {})["envlink.bridge.queue_wait_s"]
        assert isinstance(wait, float) and wait >= 0
        assert client.start_time is not None and handler.start_time is not None
        assert client.start_time >= handler.start_time
    points = {m.name: m for m in otel.metrics()}
    waits = {dict(p.attributes)["rpc.method"]: p.count
             for p in points["envlink.bridge.wait.duration"].data.data_points}
    assert waits["reset"] == 1 and waits["step"] == 1
    calls = {dict(p.attributes)["rpc.method"]: p.count
             for p in points["rpc.client.call.duration"].data.data_points
             if dict(p.attributes)["rpc.method"] in ("reset", "step")}
    assert calls == {"reset": 1, "step": 1}
    bridged = {dict(p.attributes)["rpc.method"]
               for p in points[METRIC_BRIDGE_CALL_DURATION].data.data_points} \
        if METRIC_BRIDGE_CALL_DURATION in points else set()
    assert not bridged & {"reset", "step"}


def test_one_facade_from_many_threads(server_thread: ServerThread) -> None:
    """4 threads x 25 steps through one facade: every answer is the thread's own."""
    env = GenericEnvClient(base_url=server_thread.url).sync()
    barrier = threading.Barrier(4)

    def worker(i: int) -> int:
        barrier.wait()
        wrong = 0
        for n in range(25):
            message = f"{i}-{n}"
            if env.step({"message": message}).observation["echoed_message"] != message:
                wrong += 1
        return wrong

    try:
        env.reset()
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(worker, range(4))) == [0, 0, 0, 0]
        assert env.state()["step_count"] == 100
    finally:
        env.close()


def test_many_sessions_share_one_bridge(server_thread: ServerThread) -> None:
    """10 sessions on one shared bridge use its single thread; closing them leaves it open."""
    with Bridge() as shared:
        envs = [GenericEnvClient(base_url=server_thread.url).sync(bridge=shared) for _ in range(10)]
        for i, env in enumerate(envs):
            env.reset()
            assert env.step({"message": str(i)}).observation["echoed_message"] == str(i)
        bridge_threads = {t for t in envlink_threads() if t.name.startswith("envlink-bridge")}
        assert shared.thread in bridge_threads
        for env in envs:
            env.close()
        assert not shared.closed
        assert shared.thread is not None
        assert shared.thread.is_alive()


def test_8_threads_x_500_steps_on_one_sync_client(server_thread: ServerThread) -> None:
    """8 threads x 500 step() calls on one sync client: 0 wrong answers, 0 errors."""
    env = GenericEnvClient(base_url=server_thread.url).sync()
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(i: int) -> int:
        barrier.wait()
        wrong = 0
        for n in range(500):
            message = f"t{i}-{n}"
            try:
                got = env.step({"message": message}).observation["echoed_message"]
            except Exception as exc:  # counted, not raised: the test reports them all
                errors.append(exc)
                continue
            wrong += got != message
        return wrong

    try:
        env.reset()
        with ThreadPoolExecutor(8) as pool:
            wrong = list(pool.map(worker, range(8)))
        assert errors == []
        assert wrong == [0] * 8
        assert env.state()["step_count"] == 4000
    finally:
        env.close()


def test_200_real_sync_clients_leave_no_envlink_thread(server_thread: ServerThread) -> None:
    """200 sync clients on real connections, created, used and closed: no thread left."""
    before = envlink_threads()
    for i in range(200):
        with GenericEnvClient(base_url=server_thread.url).sync() as env:
            env.reset()
            assert env.step({"message": str(i)}).observation["echoed_message"] == str(i)
    assert envlink_threads() - before == set()
    # Every connection was closed properly: the server saw each one end.
    opened = server_thread.call(lambda srv: srv.connections_opened)
    server_thread.call(lambda srv: srv.wait_for("connection.closed", opened), timeout=10)
    assert server_thread.call(lambda srv: srv.active_connections) == 0


def test_forked_child_never_touches_the_parents_session() -> None:
    """A forked child's facade starts its own session; closing it leaves the parent's intact."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os, sys
        from envlink import GenericEnvClient
        from envlink.server import ServerThread

        with ServerThread(env="echo") as st:
            env = GenericEnvClient(base_url=st.url).sync()
            env.reset()
            env.step({"message": "parent-1"})
            parent_session = env.async_client.session_id
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    env.reset()
                    ok = env.step({"message": "child"}).observation["echoed_message"] == "child"
                    fresh = env.async_client.session_id != parent_session
                    env.close()
                    code = 0 if ok and fresh else 3
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
            got = env.step({"message": "parent-2"}, timeout=5).observation["echoed_message"]
            assert got == "parent-2", got
            assert env.state()["step_count"] == 2
            assert env.async_client.session_id == parent_session
            env.close()
            print("ok", st.call(lambda srv: srv.counter("session.created")))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok", "2"]  # the parent's session and the child's own


@pytest.mark.parametrize("how", ["sync", "plain", "own-bridge"])
def test_a_closed_client_is_used_again_in_blocking_code(server_thread: ServerThread,
                                                        how: str) -> None:
    """As OpenEnv's: after close() (no envlink thread left), the next blocking call opens a
    new connection on a bridge again (the default bridge leased anew, or a new bridge of
    the facade's own), and close() ends it again; `with` twice on one client works.
    close(final=True) refuses later calls."""
    before = envlink_threads()
    opened = server_thread.server.connections_opened
    client = GenericEnvClient(server_thread.url)
    env = client if how == "plain" else client.sync(nested_spans=how == "own-bridge")
    for n in range(3):
        with env:
            env.reset()
            assert env.step({"message": str(n)}).observation["echoed_message"] == str(n)
        assert envlink_threads() - before == set()
    env.reset()
    env.close(final=True)
    assert envlink_threads() - before == set()
    with pytest.raises(RuntimeError, match=r"close\(final=True\)"):
        env.reset()
    assert envlink_threads() - before == set()
    assert server_thread.server.connections_opened - opened == 4
