"""ServerThread: the server on its own loop in a daemon thread, for sync tests."""

from __future__ import annotations

import json
import threading

import pytest
from websockets.sync.client import connect

from envlink.server import EnvServer, ServerThread

pytestmark = pytest.mark.timeout(15)


def test_sync_usage() -> None:
    """A sync client talks to the threaded server; call() runs plain and async functions there."""
    with ServerThread(env="echo", ping_interval=None) as st:
        names = [t.name for t in threading.enumerate()]
        assert "envlink-test-server" in names
        assert st.url == f"ws://127.0.0.1:{st.port}"
        with connect(st.url + "/ws") as ws:
            ws.send(json.dumps({"type": "step", "data": {"message": "hi"}}))
            assert json.loads(ws.recv())["data"]["observation"]["echoed_message"] == "hi"
        st.call(lambda s: s.wait_for_request("step", 1))
        assert st.call(lambda s: s.steps_applied) == 1

        async def faults_on(server: EnvServer) -> int:
            server.faults.error_frames = 1
            return server.faults.error_frames

        assert st.call(faults_on) == 1
        with connect(st.url + "/ws") as ws:
            ws.send(json.dumps({"type": "state"}))
            assert json.loads(ws.recv())["type"] == "error"
    assert "envlink-test-server" not in [t.name for t in threading.enumerate()]


def test_call_from_server_thread_refused() -> None:
    """call() from the server's own thread raises instead of deadlocking."""
    with ServerThread() as st:
        def reenter(_: EnvServer) -> object:
            return st.call(lambda s: s.port)

        with pytest.raises(RuntimeError, match="deadlock"):
            st.call(reenter)


def test_start_failure_propagates() -> None:
    """A server that cannot start raises from __enter__ (here: an unknown environment)."""
    with pytest.raises(ValueError, match="unknown environment"), ServerThread(env="nope"):
        pass


def test_stop_is_idempotent() -> None:
    """stop() may be called twice."""
    st = ServerThread()
    st.start()
    st.stop()
    st.stop()


def test_call_timeout_cancels_and_the_server_goes_on() -> None:
    """A call that does not finish in time raises TimeoutError (it is cancelled on the
    server loop); the next call works; after stop() calls are refused."""
    st = ServerThread()
    st.start()
    try:
        with pytest.raises(TimeoutError):
            st.call(lambda s: s.wait_for_request("step", 1), timeout=0.05)
        assert st.call(lambda s: s.steps_applied) == 0
    finally:
        st.stop()
    with pytest.raises(RuntimeError, match="not running"):
        st.call(lambda s: s.port)
