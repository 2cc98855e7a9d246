"""TRL's real harness rollout loop (``HarnessRolloutWorker``) on envlink's session factory.

The worker's own ``__init__`` refuses to run without vLLM, so its rollout loop class
(``HarnessRolloutWorker._loop_cls``, what the worker's spawned child runs) is built here
in-process, with the keyword arguments the worker forwards, and run as the child runs it
(``run()``: TRL's generate and score loops, its per-rollout ``_run_session``). In
adapter mode TRL samples each turn from a scripted ``/v1/completions`` server standing
in for vLLM; in loop-owning mode (the default) TRL samples nothing and reads the
agent's captured calls back from the session: from envlink's reference ``/harness``, or
(``capture_url=``) from OpenEnv's capture proxy in front of a stock OpenEnv harness
server's agent.

Needs TRL, openenv and aiohttp (``bash .ci/trl.sh``); elsewhere it reports itself skipped.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import pickle
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ._support import require

require("trl", "ENVLINK_REQUIRE_TRL", "bash .ci/trl.sh builds the virtualenv")
require("aiohttp", "ENVLINK_REQUIRE_TRL", "bash .ci/trl.sh installs it with TRL")

import os  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import pytest  # noqa: E402
from accelerate.state import PartialState  # noqa: E402
from aiohttp import web  # noqa: E402
from datasets import Dataset  # noqa: E402
from openenv.core.harness import MCPHarnessAdapter, TrainableSession  # noqa: E402
from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker  # noqa: E402

from envlink import ConnectionLostError, HandshakeRejectedError  # noqa: E402
from envlink.integrations.openenv_harness import (  # noqa: E402
    EnvlinkHarnessSession,
    EnvlinkSessionFactory,
    TrainingTraceUnavailableError,
)
from envlink.server import ServerThread  # noqa: E402
from envlink.server._environments.echo_harness import ECHO_LOGP  # noqa: E402

from ..interop._interop_support import ServerProcess, openenv_server  # noqa: E402
from ..interop.test_capture_sessions import FIRST, SECOND, ScriptedEngine  # noqa: E402
from ._tiny_lm import build_tokenizer, conversation  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PROMPT = "hello"


def echo_message(message: str) -> str:
    """Echo a message back.

    Args:
        message: the text to echo.
    """
    return message


def step_count(session: Any, transcript: Any) -> float:
    """The episode's reward: the server's step count (module-level: it crosses a spawn)."""
    return float(session.client.state()["step_count"])


class _Value:
    """What the worker shares with its child as ``mp.Value``: a ``value`` attribute."""

    def __init__(self, value: float) -> None:
        self.value = value


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """A tiny byte-level tokenizer with Qwen 2.5's template (TRL parses its tool calls)."""
    return build_tokenizer([conversation(PROMPT, "echo_message", PROMPT, "done")],
                           [echo_message])


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """The reference server (echo environment and echo harness) in a thread."""
    with ServerThread(env="echo", ping_interval=None) as st:
        yield st


def build_loop(tokenizer: Any, factory: Any, **kwargs: Any) -> Any:
    """TRL's harness rollout loop, with what ``HarnessRolloutWorker`` forwards to its child."""
    pickle.dumps(factory)  # the worker checks this before it spawns; so does this
    PartialState()  # what the worker's child does first (TRL's logging needs it)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": PROMPT}]}] * 4)
    return HarnessRolloutWorker._loop_cls(
        model_name="tiny", dataset=dataset, reward_funcs=[], processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id], rollout_buffer=queue.Queue(),
        model_version_value=_Value(0), heartbeat_value=_Value(0.0),
        failed_event=threading.Event(), exception_info_queue=queue.Queue(maxsize=1),
        metrics_queue=queue.Queue(), harness_session_factory=factory, num_generations=2,
        max_inflight_tasks=2, max_tokens=64, temperature=0.7,
        max_tool_calling_iterations=3, **kwargs)


def run_until(loop: Any, samples: int) -> list[Any]:
    """Run the loop as the worker's child does until ``samples`` rollout samples are out."""
    thread = threading.Thread(target=loop.run, name="rollout-child")
    thread.start()
    out = []
    try:
        for _ in range(samples):
            out.append(loop.rollout_buffer.get(timeout=60))
    finally:
        loop._loop.call_soon_threadsafe(loop._stop_event.set)
        thread.join(60)
    assert not thread.is_alive()
    assert not loop._failed_event.is_set(), loop._exception_info_queue.get_nowait()
    return out


def no_sessions_left(st: ServerThread, created: int) -> None:
    st.call(lambda s: s._counters.wait("session.destroyed", created), timeout=30)
    assert st.call(lambda s: len(s._registry)) == 0


def test_loop_owning_mode_trains_on_the_harness_captures(server: ServerThread,
                                                         tokenizer: Any) -> None:
    """The worker's default mode: TRL calls the factory with its sampling policy, each session
    is a TrainableSession whose captured calls become training rows (the agent's sampled
    tokens trained, their logprobs kept), scored by the environment's reward; no
    CaptureContractError, and every session is closed."""
    loop = build_loop(tokenizer, functools.partial(EnvlinkSessionFactory, server.url))
    factory = loop._factory
    assert factory.loop_owning
    assert factory.sampling is not None and factory.sampling["temperature"] == 0.7
    samples = run_until(loop, 4)
    for sample in samples:
        mask = sample.completion_mask.tolist()
        trained = [lp for lp, m in zip(sample.old_log_probs.tolist(), mask, strict=True) if m]
        # Two model calls per run, the second's prompt extending the first: one row,
        # the tokens of both replies trained at the logprob the "engine" reported.
        assert trained and all(lp == pytest.approx(ECHO_LOGP) for lp in trained)
        assert len(sample.input_ids) == len(mask)
        assert sample.metrics["rewards/harness_reward"] == 1.0
        assert sample.completion[-1] == {"role": "assistant", "content": PROMPT}
    assert factory.failed == 0
    no_sessions_left(server, factory.created)


def captured_calls(session: Any, transcript: Any) -> float:
    """The episode's reward: how many model calls the proxy captured (module-level)."""
    return float(len(session.fetch_proxy_trace()))


@pytest.fixture
def capture_stack(tmp_path: Any) -> Iterator[tuple[ServerProcess, ServerProcess,
                                                  ScriptedEngine]]:
    """OpenEnv's production harness server (its agent calls ``OPENAI_BASE_URL``) and
    OpenEnv's CaptureServer in front of a scripted engine, all on 127.0.0.1."""
    with ScriptedEngine() as engine:
        capture = openenv_server("capture", sys.executable, tmp_path,
                                 extra_args=["--llm-url", engine.url])
        harness = openenv_server("agent_harness", sys.executable, tmp_path, max_sessions=4)
        capture.start()
        try:
            harness.start()
            try:
                yield harness, capture, engine
            finally:
                harness.stop()
        finally:
            capture.stop()


def test_loop_owning_mode_trains_from_openenv_capture_proxy(
        capture_stack: tuple[ServerProcess, ServerProcess, ScriptedEngine],
        tokenizer: Any) -> None:
    """Loop-owning mode on stock OpenEnv: TRL calls the factory partial (with
    ``capture_url=``) with its sampling policy; each rollout's agent, run by OpenEnv's own
    harness server, calls the engine through OpenEnv's capture proxy, and each training
    sample holds exactly the engine's token ids and logprobs of that run's two calls
    (one row: the second call's prompt extends the first's), the tool result's tokens
    between them untrained."""
    harness, capture, engine = capture_stack
    loop = build_loop(tokenizer, functools.partial(
        EnvlinkSessionFactory, harness.base_url, capture_url=capture.base_url,
        reward=captured_calls))
    factory = loop._factory
    assert factory.loop_owning and factory.capture_url == capture.base_url
    samples = run_until(loop, 4)
    between = SECOND["prompt"][len(FIRST["prompt"]) + len(FIRST["ids"]):]
    completion = FIRST["ids"] + between + SECOND["ids"]
    for sample in samples:
        assert sample.input_ids.tolist() == FIRST["prompt"] + completion
        mask = sample.completion_mask.tolist()
        assert mask == [0] * len(FIRST["prompt"]) + [1] * len(FIRST["ids"]) + [0] * len(
            between) + [1] * len(SECOND["ids"])
        trained = [lp for lp, m in zip(sample.old_log_probs.tolist(), mask, strict=True) if m]
        assert trained == pytest.approx(FIRST["logprobs"] + SECOND["logprobs"])
        assert sample.metrics["rewards/harness_reward"] == 2.0
        assert sample.completion[-1] == {"role": "assistant", "content": "done"}
    # Every model call went through the proxy with the worker's policy applied.
    assert len(engine.requests) >= 8
    assert all(r["temperature"] == 0.7 for r in engine.requests)
    assert factory.failed == 0 and factory.created >= 4


def scripted_completions(tokenizer: Any, requests: list[dict[str, Any]]) -> Any:
    """A scripted ``/v1/completions``: call the echo tool first, then answer."""

    async def completions(request: web.Request) -> web.Response:
        return web.json_response(reply(await request.json()))

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        requests.append(body)
        return {"choices": [{"token_ids": (ids := answer(body)),
                             "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]}

    def answer(body: dict[str, Any]) -> list[int]:
        if "<tool_response>" in tokenizer.decode(body["prompt"]):
            text = "done<|im_end|>"
        else:
            call = {"name": "echo_message", "arguments": {"message": PROMPT}}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
        return list(tokenizer.encode(text, add_special_tokens=False))

    return completions


@pytest.fixture
def fake_vllm(tokenizer: Any) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The scripted completions server on 127.0.0.1, in a thread of its own."""
    app, requests = web.Application(), []
    app.router.add_post("/v1/completions", scripted_completions(tokenizer, requests))
    runner = web.AppRunner(app)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_adapter_mode_samples_each_turn_through_step_sessions(
        server: ServerThread, tokenizer: Any,
        fake_vllm: tuple[str, list[dict[str, Any]]]) -> None:
    """With OpenEnv's MCP harness adapter, TRL calls the factory with no arguments, samples
    each turn itself and calls the environment's tool through envlink's step session; the
    rollouts are scored by the factory's reward and every session is closed."""
    url, requests = fake_vllm
    factory = functools.partial(EnvlinkSessionFactory, server.url, reward=step_count)
    loop = build_loop(tokenizer, factory, harness_adapter=MCPHarnessAdapter(),
                      vllm_server_url=url)
    assert not loop._factory.loop_owning
    samples = run_until(loop, 4)
    for sample in samples:
        assert sample.metrics["rewards/harness_reward"] == 2.0  # list_tools + one call
        assert sample.metrics["tools/call_frequency"] == 1.0
    assert requests and all(r["temperature"] == 0.7 for r in requests)
    seen = server.call(lambda s: s._counters.snapshot())
    assert seen["applied.step"] >= 8
    no_sessions_left(server, loop._factory.created)


def test_a_server_without_training_captures_is_refused_at_create(
        server: ServerThread, tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Loop-owning mode against a /harness that gives no training trace: TRL's create sees
    a TrainingTraceUnavailableError (the rollout is unscorable, logged with the reason)
    and no CaptureContractError ever stops the worker; nothing is left open."""
    server.call(lambda s: setattr(s, "harness_training_trace", False))
    loop = build_loop(tokenizer, functools.partial(EnvlinkSessionFactory, server.url))
    with caplog.at_level(logging.WARNING):
        result, metrics = loop._run_session([{"role": "user", "content": PROMPT}], 0)
    assert result == loop._EMPTY_ROLLOUT and metrics is None
    failures = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert failures and isinstance(failures[0], TrainingTraceUnavailableError)
    assert "harness_adapter=" in str(failures[0])
    assert loop._factory.failed == 1
    no_sessions_left(server, 1)


def test_openenv_servers_harness_is_refused_at_create(tmp_path: Any) -> None:
    """OpenEnv's own production /harness (a real OpenEnv 0.10 app, one session) streams no
    training captures: create refuses it with the typed error, every time, so each
    create's session was closed (the next one got the only slot)."""
    server = openenv_server("harness", sys.executable, tmp_path)
    server.start()
    try:
        factory = EnvlinkSessionFactory(server.base_url, sampling={"temperature": 1.0},
                                        create_timeout=30)
        for _ in range(2):
            with pytest.raises(TrainingTraceUnavailableError, match="interop-scripted"):
                factory.create(PROMPT)
        assert (factory.created, factory.failed) == (0, 2)
    finally:
        server.stop()


def test_an_openenv_server_without_harness_is_refused_at_create(tmp_path: Any) -> None:
    """A real OpenEnv 0.10 app with no /harness route (its upgrade answered 403): create
    raises the typed error at once, the rejected upgrade chained as its cause."""
    server = openenv_server("echo", sys.executable, tmp_path)
    server.start()
    try:
        factory = EnvlinkSessionFactory(server.base_url, sampling={"temperature": 1.0},
                                        create_timeout=30)
        with pytest.raises(TrainingTraceUnavailableError, match="no /harness") as info:
            factory.create(PROMPT)
        assert isinstance(info.value.__cause__, HandshakeRejectedError)
        assert info.value.__cause__.status == 403
    finally:
        server.stop()


def test_sessions_are_trainable_only_in_loop_owning_mode(server: ServerThread) -> None:
    """Loop-owning sessions satisfy OpenEnv's TrainableSession; step sessions do not (TRL's
    adapter path needs none of it)."""
    run = EnvlinkSessionFactory(server.url, sampling={"temperature": 1.0}).create(PROMPT)
    try:
        assert isinstance(run, EnvlinkHarnessSession) and isinstance(run, TrainableSession)
        assert run.wait_for_completion(30) == 0
        assert [t.metadata["sampling"] for t in run.fetch_training_trace().turns] == [
            {"temperature": 1.0}] * 2
    finally:
        run.close()
    with EnvlinkSessionFactory(server.url).create(PROMPT) as step_session:
        assert not isinstance(step_session, TrainableSession)


def test_a_run_cut_by_a_dropped_connection_is_unscorable(
        server: ServerThread, tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Loop-owning mode, the harness connection cut mid-run: TRL's _run_session gets the
    typed ConnectionLostError from wait_for_completion and scores the rollout unscorable
    (never a CaptureContractError, which would stop the worker); the session is closed."""
    loop = build_loop(tokenizer, functools.partial(EnvlinkSessionFactory, server.url))
    with caplog.at_level(logging.WARNING):
        result, metrics = loop._run_session([{"role": "user", "content": "!drop"}], 0)
    assert result == loop._EMPTY_ROLLOUT and metrics is None
    failures = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert failures and isinstance(failures[0], ConnectionLostError)
    no_sessions_left(server, 1)


def test_the_real_worker_spawns_its_child_and_trains_loop_owning(
        server: ServerThread, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """HarnessRolloutWorker itself, in its default mode: it pickles the factory partial into
    a spawned child, whose rollout loop calls it with the sampling policy and trains on
    the harness captures; the samples come back through the worker's queue, the child
    stays healthy, and stop() leaves no session open. (Its vLLM check is bypassed: in this
    mode nothing calls vLLM.)"""
    import trl.experimental.async_grpo.async_rollout_worker as rollout_worker

    monkeypatch.setattr(rollout_worker, "is_vllm_available", lambda: True)
    PartialState()  # the trainer holding the worker has set up accelerate (TRL logs with it)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": PROMPT}]}] * 4)
    worker = HarnessRolloutWorker(
        harness_session_factory=functools.partial(EnvlinkSessionFactory, server.url),
        model_name="tiny", dataset=dataset, reward_funcs=[], processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id], num_generations=2, max_inflight_tasks=2,
        max_tokens=64, temperature=0.7, child_ready_timeout=120)
    worker.start()
    try:
        samples = [worker.rollout_buffer.get(timeout=90) for _ in range(2)]
        worker.check_health(stale_after_s=120)
    finally:
        worker.stop()
    for sample in samples:
        assert sample.metrics["rewards/harness_reward"] == 1.0
        assert sample.old_log_probs[sample.completion_mask == 1].tolist() == pytest.approx(
            [ECHO_LOGP] * int(sample.completion_mask.sum()))
    created = server.call(lambda s: s._counters.snapshot())["session.created"]
    no_sessions_left(server, created)
