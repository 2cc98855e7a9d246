"""Loop-owning sessions on stock OpenEnv: the trace from OpenEnv's capture proxy.

``EnvlinkSessionFactory(..., sampling=..., capture_url=...)`` against a real OpenEnv
0.10 harness server (``servers/agent_harness_server.py``: a ``HarnessEnvironment``
whose agent runs its own loop against ``OPENAI_BASE_URL``) and OpenEnv's own
``CaptureServer`` (``servers/capture_server.py``), both on 127.0.0.1, in front of a
scripted OpenAI-compatible engine served here. The engine answers every
``/chat/completions`` with ``prompt_token_ids``, the sampled ``token_ids`` and their
logprobs, as vLLM does with ``return_token_ids``; the training trace read back from
the proxy must hold exactly those, per model call. OpenEnv's ``TrainingTrace`` and
its session protocols are checked in envlink's interpreter with the openenv
virtualenv's site-packages appended (a user with both installed), in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from envlink import ClientConfig, ServerError
from envlink.hooks import CallFinished, CallStarted, ClientHook
from envlink.integrations.openenv_harness import (
    CaptureProxyError,
    EnvlinkCaptureSession,
    EnvlinkSessionFactory,
)

from ._interop_support import RecordingServer

pytestmark = pytest.mark.timeout(120)

PROMPT = "hello"
SAMPLING = {"temperature": 0.7}

#: The scripted engine's two calls of a run: the first asks for the tool, the second
#: answers. Turn 2's prompt extends turn 1's prompt and completion (the tool result's
#: tokens after them), as an engine's own tokenisation does.
FIRST = {"prompt": [1, 2, 3], "ids": [10, 11, 12], "logprobs": [-0.1, -0.2, -0.3]}
SECOND = {"prompt": [1, 2, 3, 10, 11, 12, 20, 21], "ids": [30, 31],
          "logprobs": [-0.5, -0.25]}


class ScriptedEngine:
    """An OpenAI-compatible engine on 127.0.0.1 that answers from a script."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # /v1/models
                self._send({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with engine._lock:
                    engine.requests.append(body)
                self._send(engine.answer(body))

            def _send(self, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        first = len(body.get("messages") or []) == 1
        turn = FIRST if first else SECOND
        message: dict[str, Any] = {"role": "assistant", "content": None if first else "done"}
        if first:
            message["tool_calls"] = [{"id": "call_1", "type": "function", "function": {
                "name": "echo", "arguments": json.dumps({"message": PROMPT})}}]
        return {
            "id": "cmpl-1", "object": "chat.completion", "model": body.get("model"),
            "prompt_token_ids": turn["prompt"],
            "choices": [{
                "index": 0, "message": message,
                "finish_reason": "tool_calls" if first else "stop",
                "token_ids": turn["ids"],
                "logprobs": {"content": [
                    {"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
                    for i, lp in zip(turn["ids"], turn["logprobs"], strict=True)]},
            }],
            "usage": {"prompt_tokens": len(turn["prompt"]),
                      "completion_tokens": len(turn["ids"]),
                      "total_tokens": len(turn["prompt"]) + len(turn["ids"])},
        }

    def __enter__(self) -> ScriptedEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


class Recorder(ClientHook):
    """Every call the factory's clients report, by name."""

    def __init__(self) -> None:
        self.finished: list[CallFinished] = []

    def call_started(self, event: CallStarted) -> Any:
        return None

    def call_finished(self, event: CallFinished, token: Any) -> None:
        self.finished.append(event)


@pytest.fixture
def engine() -> Iterator[ScriptedEngine]:
    with ScriptedEngine() as running:
        yield running


@pytest.fixture
def stack(spawn_openenv: Callable[..., RecordingServer], engine: ScriptedEngine
          ) -> tuple[RecordingServer, RecordingServer]:
    """OpenEnv's harness server and OpenEnv's capture proxy in front of the engine."""
    capture = spawn_openenv("capture", extra_args=["--llm-url", engine.url])
    harness = spawn_openenv("agent_harness", max_sessions=4)
    return harness, capture


def check_entries(entries: list[dict[str, Any]]) -> None:
    """The capture holds exactly the engine's ids and logprobs, one entry per model call."""
    assert [e["prompt_token_ids"] for e in entries] == [FIRST["prompt"], SECOND["prompt"]]
    assert [e["completion_token_ids"] for e in entries] == [FIRST["ids"], SECOND["ids"]]
    assert [e["per_token_logps"] for e in entries] == [FIRST["logprobs"], SECOND["logprobs"]]
    for entry in entries:
        assert entry["loss_mask"] == [0] * len(entry["prompt_token_ids"]) + [1] * len(
            entry["completion_token_ids"])
        assert entry["metadata"]["sampling_params"]["temperature"] == SAMPLING["temperature"]


#: OpenEnv's side of a rollout, in a user's interpreter with envlink and openenv.
DRIVER = textwrap.dedent("""
    import json, os, sys
    sys.path.append(os.environ["OPENENV_SITE"])
    from openenv.core.harness import LoopOwningSession, TrainableSession, TrainingTrace
    from envlink.integrations.openenv_harness import EnvlinkSessionFactory
    factory = EnvlinkSessionFactory(sys.argv[1], sampling={"temperature": 0.7},
                                    capture_url=sys.argv[2])
    session = factory.create("hello", seed=1, episode_id="ep-1")
    try:
        assert isinstance(session, TrainableSession)
        assert isinstance(session, LoopOwningSession)
        code = session.wait_for_completion(timeout_s=60)
        trace = session.fetch_training_trace()
        assert isinstance(trace, TrainingTrace)
        verified = session.verify([])
    finally:
        session.close()
    print(json.dumps({"code": code, "reward": verified.env_reward, "done": verified.done,
                      "turns": [t.model_dump() for t in trace.turns]}))
""")


def test_openenv_trainable_session_fetches_the_training_trace(
        stack: tuple[RecordingServer, RecordingServer], openenv_py: str) -> None:
    """With OpenEnv installed, the session is OpenEnv's TrainableSession (and
    LoopOwningSession), and fetch_training_trace() gives OpenEnv's TrainingTrace with the
    engine's exact prompt ids, sampled ids and logprobs for each of the agent's calls."""
    harness, capture = stack
    site = subprocess.run([openenv_py, "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    done = subprocess.run([sys.executable, "-c", DRIVER, harness.base_url, capture.base_url],
                          capture_output=True, text=True, timeout=100, check=False,
                          env={**os.environ, "OPENENV_SITE": site}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["code"] == 0 and out["done"] is True
    check_entries(out["turns"])
    assert all(t["metadata"]["capture_session_id"] for t in out["turns"])


def test_loop_owning_session_trains_from_openenv_capture_proxy(
        stack: tuple[RecordingServer, RecordingServer], engine: ScriptedEngine) -> None:
    """The factory mints the rollout's key on the proxy, resets OpenEnv's harness
    environment with its agent pointed there, waits for the run and reads the captured
    calls back: OpenEnv's TrainableSession, with the engine's exact tokens per turn, the
    run reported as one harness_turn call, and the key ended on close."""
    harness, capture = stack
    recorder = Recorder()
    factory = EnvlinkSessionFactory(
        harness.base_url, sampling=SAMPLING, capture_url=capture.base_url,
        client_config=ClientConfig(on_capacity="wait", hooks=[recorder]))
    assert factory.loop_owning
    session = factory.create(PROMPT, seed=1, episode_id="ep-1")
    assert isinstance(session, EnvlinkCaptureSession)
    try:
        assert session.capture["rollout_type"] == "train"
        assert session.wait_for_completion(timeout_s=60) == 0
        check_entries(session.fetch_proxy_trace())
        result = session.verify([])
        assert result.metrics["tool_calls"] == 1 and result.metrics["completed"]
        assert result.done
    finally:
        session.close()
    # The agent's calls went through the proxy under the rollout's key, with the
    # trainer's policy applied, and only then to the engine.
    assert len(engine.requests) == 2
    assert all(r["temperature"] == SAMPLING["temperature"] for r in engine.requests)
    turns = [e for e in recorder.finished if e.method == "harness_turn"]
    assert [t.outcome for t in turns] == ["ok"]
    assert factory.created == 1 and factory.failed == 0
    # Closing ended the capture session: its key is no longer known to the proxy.
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{capture.base_url}/sessions/{session.capture_key}",
                               timeout=10)
    assert info.value.code == 404


def test_a_group_of_rollouts_is_captured_apart(
        stack: tuple[RecordingServer, RecordingServer]) -> None:
    """Two rollouts of one prompt at once (a GRPO group): each has its own key, and each
    trace holds its own run's two calls only."""
    harness, capture = stack
    factory = EnvlinkSessionFactory(harness.base_url, sampling=SAMPLING,
                                    capture_url=capture.base_url)
    sessions = [factory.create(PROMPT) for _ in range(2)]
    try:
        keys = {s.capture_key for s in sessions}  # type: ignore[union-attr]
        assert len(keys) == 2
        for session in sessions:
            assert session.wait_for_completion(timeout_s=60) == 0  # type: ignore[union-attr]
            check_entries(session.fetch_proxy_trace())  # type: ignore[union-attr]
    finally:
        for session in sessions:
            session.close()


def test_a_policy_the_proxy_cannot_train_on_is_refused_at_create(
        stack: tuple[RecordingServer, RecordingServer]) -> None:
    """A sampling policy the proxy refuses for training (a truncating top_p) fails create
    with the proxy's reason; nothing is left open on the harness server."""
    harness, capture = stack
    factory = EnvlinkSessionFactory(harness.base_url, sampling={"temperature": 0.7,
                                                                "top_p": 0.5},
                                    capture_url=capture.base_url, create_timeout=10)
    with pytest.raises(CaptureProxyError, match="top_p") as info:
        factory.create(PROMPT)
    assert info.value.status == 400
    assert factory.failed == 1
    # The server's one-at-a-time slots are all free: a full group can still start.
    ok = EnvlinkSessionFactory(harness.base_url, sampling=SAMPLING,
                               capture_url=capture.base_url)
    sessions = [ok.create(PROMPT) for _ in range(4)]
    for session in sessions:
        session.close()


def test_an_agent_without_the_proxy_fails_its_run(
        stack: tuple[RecordingServer, RecordingServer]) -> None:
    """An environment whose agent is not given the endpoint (agent_env names other
    variables) fails the run: wait_for_completion raises the environment's error (OpenEnv's
    server answers the failed step with an error frame), never a trace of nothing."""
    harness, capture = stack
    factory = EnvlinkSessionFactory(harness.base_url, sampling=SAMPLING,
                                    capture_url=capture.base_url,
                                    agent_env=lambda url, key: {"OTHER_URL": url})
    session = factory.create(PROMPT)
    try:
        with pytest.raises(ServerError, match="no inference endpoint"):
            session.wait_for_completion(timeout_s=60)  # type: ignore[union-attr]
    finally:
        session.close()
