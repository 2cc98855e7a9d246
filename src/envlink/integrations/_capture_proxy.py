"""Loop-owning sessions whose training trace comes from OpenEnv's capture proxy.

OpenEnv 0.10 captures a loop-owning rollout with ``openenv.core.harness.capture``: an
OpenAI-spec proxy (``CaptureServer``) between the environment's agent and the
inference engine, which records the engine's token ids and logprobs of every model
call. Each rollout has a key of its own, minted by ``POST /sessions``; the agent uses
it as its API key, so every call it makes is filed under the rollout; the trainer then
reads the rollout back (``GET /sessions/{key}/rollout`` and ``/trace_entries``).

:class:`EnvlinkCaptureSession` does this on any OpenEnv harness environment (a
``HarnessEnvironment`` on OpenEnv's own server) whose agent takes its inference
endpoint at reset:

1. the rollout's key is minted on the proxy, with the trainer's sampling policy;
2. the environment is reset on a step session (``/ws``) with ``agent_env`` (by
   default ``OPENAI_BASE_URL`` = the proxy's ``/v1`` and ``OPENAI_API_KEY`` = the key,
   the variables OpenEnv's own loop-owning runners give an OpenAI-compatible agent):
   OpenEnv's server passes reset keywords to ``HarnessEnvironment.reset_async``, and
   the environment hands them to its agent before starting it;
3. the task is one ``HarnessAction`` step (the agent's whole run), in the background,
   reported as a ``harness_turn`` call;
4. :meth:`~EnvlinkCaptureSession.fetch_training_trace` reads the rollout's capture
   from the proxy as OpenEnv's ``TrainingTrace``.

Minting and the reset go through envlink's retry primitive under the factory's create
deadline (a refused connection, a full server and a proxy answering 5xx are tried
again); nothing is left open on the server or the proxy when ``create`` fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from envlink._client.client import StepResult
from envlink._deadlines import deadline
from envlink._errors import (
    CaptureProxyError,
    ClientClosedError,
    EnvlinkError,
    HarnessTurnError,
)
from envlink._events.client_events import (
    CallFinished,
    CallStarted,
    ClientHook,
    combine_client_hooks,
)
from envlink._transports.base import parse_endpoint
from envlink._transports.http import request_json
from envlink.integrations._runtime import Lease, stop_run, transient, wait_for_run
from envlink.names import (
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_TIMEOUT,
    SPAN_HARNESS_TURN,
)

if TYPE_CHECKING:
    from envlink._client.configuration import ClientConfig

__all__ = ["CaptureProxy", "EnvlinkCaptureSession", "openai_agent_env", "retryable"]

Message = dict[str, Any]


class CaptureFactory(Protocol):
    """What a capture session reads of the factory that made it (an
    ``EnvlinkSessionFactory``): declared here, so that this module does not import the
    factory's, which imports it."""

    @property
    def base_url(self) -> str: ...
    @property
    def client_config(self) -> ClientConfig: ...
    @property
    def run_timeout(self) -> float | None: ...
    @property
    def initial_messages(self) -> Callable[[StepResult[Any], Any], list[Message]]: ...
    @property
    def reward(self) -> Callable[[Any, list[Message]], float | None] | None: ...

#: The largest capture document read back (a long agentic rollout's token ids).
_MAX_CAPTURE = 256 * 1024 * 1024


def openai_agent_env(base_url: str, api_key: str) -> dict[str, str]:
    """The agent's environment for an OpenAI-compatible agent: the proxy's ``/v1`` as its
    base URL and the rollout's key as its API key (as OpenEnv's runners set them)."""
    return {"OPENAI_BASE_URL": f"{base_url}/v1", "OPENAI_API_KEY": api_key}


def retryable(exc: BaseException) -> bool:
    """Whether minting a key or resetting may be tried again (a proxy's 5xx included)."""
    if isinstance(exc, CaptureProxyError):
        return exc.retryable
    return transient(exc)


class CaptureProxy:
    """The control routes of OpenEnv's capture proxy (the trainer's side of it).

    Args:
        url: the proxy's root URL (``http://host:port``), as the trainer reaches it.
        admin_key: the proxy's admin key, when it was started with one.
        timeout: seconds one request may take.
    """

    def __init__(self, url: str, *, admin_key: str | None = None,
                 timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._headers = [] if admin_key is None else [
            ("Authorization", f"Bearer {admin_key}")]
        self.timeout = timeout

    async def _request(self, method: str, path: str, body: Any = None,
                       timeout: float | None = None) -> Any:
        answer = await request_json(
            method, f"{self.url}{path}", body, headers=self._headers, proxy=None,
            max_size=_MAX_CAPTURE, timeout=self.timeout if timeout is None else timeout)
        if answer.status >= 400:
            detail = answer.body.get("error") if isinstance(answer.body, Mapping) else None
            if isinstance(detail, Mapping):
                detail = detail.get("message")
            raise CaptureProxyError(
                f"the capture proxy answered {method} {path} with HTTP {answer.status}"
                + (f": {detail}" if detail else ""), status=answer.status)
        return answer.body

    async def mint(self, *, sampling: Mapping[str, Any] | None,
                   metadata: Mapping[str, Any], timeout: float | None = None
                   ) -> dict[str, Any]:
        """Mint one rollout's key (``POST /sessions``, purpose ``train``).

        Raises:
            CaptureProxyError: the proxy refused (a policy it cannot capture for
                training, an endpoint without token capture, a missing admin key).
            ConnectError, ConnectionLostError: the proxy could not be reached.
        """
        payload: dict[str, Any] = {"purpose": "train", "metadata": dict(metadata)}
        if sampling is not None:
            payload["sampling"] = dict(sampling)
        body = await self._request("POST", "/sessions", payload, timeout)
        if not isinstance(body, Mapping) or not isinstance(body.get("session_id"), str):
            raise CaptureProxyError("the capture proxy minted no session id", status=502)
        return dict(body)

    async def rollout(self, key: str) -> dict[str, Any]:
        """The rollout's capture document (``GET /sessions/{key}/rollout``)."""
        body = await self._request("GET", f"/sessions/{quote(key, safe='')}/rollout")
        return dict(body) if isinstance(body, Mapping) else {}

    async def trace_entries(self, key: str) -> list[dict[str, Any]]:
        """The rollout's model calls as ``TraceEntry`` dicts (``GET .../trace_entries``)."""
        body = await self._request("GET", f"/sessions/{quote(key, safe='')}/trace_entries")
        entries = body.get("entries") if isinstance(body, Mapping) else None
        if not isinstance(entries, list):
            raise CaptureProxyError("the capture proxy gave no trace entries", status=502)
        return [dict(entry) for entry in entries]

    async def delete(self, key: str) -> None:
        """End the rollout's capture session (its key stops being accepted)."""
        await self._request("DELETE", f"/sessions/{quote(key, safe='')}")


def turn_hook(factory: CaptureFactory, url: str) -> ClientHook:
    """The hook the ``harness_turn`` call is reported to: the factory's client hooks,
    else envlink's OpenTelemetry emitter (as the harness client does)."""
    config = factory.client_config
    if config.hooks is None:
        from envlink._telemetry.client_hook import ClientTelemetryHook

        return ClientTelemetryHook(config.tracer_provider, config.meter_provider, url=url)
    return combine_client_hooks(list(config.hooks))


class AgentOwnsTheLoop:
    """What a loop-owning session answers of its own loop: its prompt, and no tools to
    drive (the agent calls them itself). Shared by the ``/harness`` session and the
    capture-proxy session."""

    _messages: list[Message]

    def initial_messages(self) -> list[Message]:
        """The prompt messages of the rollout (built from the task, and the reset)."""
        return list(self._messages)

    def list_tools(self) -> list[Any]:
        """Nothing: the agent calls the environment's tools itself in this mode."""
        return []

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """Refused: the agent owns the loop.

        Raises:
            EnvlinkError: always.
        """
        raise EnvlinkError(f"cannot call {name!r}: in a loop-owning session the agent "
                           "calls the tools (use a harness_adapter to drive them)")


class EnvlinkCaptureSession(AgentOwnsTheLoop):
    """One loop-owning rollout captured by OpenEnv's capture proxy: a ``TrainableSession``.

    Made (and started) by :meth:`EnvlinkSessionFactory.create
    <envlink.integrations.openenv_harness.EnvlinkSessionFactory.create>` when the
    factory has a ``capture_url``: the environment was reset with the agent pointed at
    the proxy under the rollout's key, and the task runs as one ``HarnessAction`` step.
    :meth:`wait_for_completion` waits for it; :meth:`fetch_training_trace` reads the
    captured model calls from the proxy; :meth:`verify` scores the run; :meth:`close`
    ends the server session and the capture session.

    The trainer does not call tools itself in this mode: :meth:`list_tools` is empty
    and :meth:`call_tool` raises.
    """

    def __init__(self, factory: CaptureFactory, lease: Lease, proxy: CaptureProxy,
                 minted: Mapping[str, Any], task: Any, reset: StepResult[Any],
                 verify_result: type[Any]) -> None:
        self._factory = factory
        #: OpenEnv's ``VerifyResult``, or its look-alike when OpenEnv is not installed.
        self._verify_result = verify_result
        self._lease = lease
        self._proxy = proxy
        self._key = str(minted["session_id"])
        #: What the proxy said of the key (``capture_level``, ``rollout_type``...).
        self.capture = dict(minted)
        self._task = task
        self._reset = reset
        self._messages = list(factory.initial_messages(reset, task))
        self._run: asyncio.Task[StepResult[Any]] | None = None
        self._closed = False

    @property
    def capture_key(self) -> str:
        """The rollout's key on the capture proxy (the agent's API key)."""
        return self._key

    @property
    def client(self) -> Any:
        """The session's :class:`~envlink.SyncEnvClient`.

        Raises:
            ClientClosedError: the session was closed.
        """
        return self._lease.held("capture session")

    def _start(self, content: str) -> None:
        client = self.client
        endpoint = parse_endpoint(self._factory.base_url)
        hook = turn_hook(self._factory, endpoint.display)
        host, port = endpoint.host, endpoint.port
        action = {"message": content}
        timeout = self._factory.run_timeout
        key = self._key

        async def drive() -> StepResult[Any]:
            token = hook.call_started(CallStarted(SPAN_HARNESS_TURN, host, port, key, None))
            start = time.perf_counter()
            error: BaseException | None = None
            try:
                result: StepResult[Any] = await client.async_client.step(action,
                                                                         timeout=timeout)
                return result
            except BaseException as exc:
                error = exc
                raise
            finally:
                outcome = OUTCOME_OK if error is None else (
                    OUTCOME_TIMEOUT if isinstance(error, TimeoutError) else
                    OUTCOME_CANCELLED if isinstance(error, asyncio.CancelledError) else
                    OUTCOME_ERROR)
                hook.call_finished(CallFinished(
                    SPAN_HARNESS_TURN, outcome, time.perf_counter() - start,
                    None if isinstance(error, asyncio.CancelledError) else error, None, None,
                    key, host, port), token)

        async def start() -> None:
            self._run = asyncio.get_running_loop().create_task(drive())

        client.bridge.call(start, timeout=5.0, method="harness.start")

    def _result(self) -> StepResult[Any] | None:
        run = self._run
        if run is None or not run.done() or run.cancelled() or run.exception() is not None:
            return None
        return run.result()

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Wait for the agent's run (the ``HarnessAction`` step) to complete.

        Args:
            timeout_s: seconds to wait (default: until the factory's ``run_timeout``).
                On expiry the run goes on; call again, or close.

        Returns:
            0 (the run completed).

        Raises:
            TimeoutError: ``timeout_s`` passed, or the run exceeded ``run_timeout`` (a
                ``CallTimeoutError``).
            HarnessTurnError: the environment reported the run failed (OpenEnv's
                ``error_type``, ``harness_crashed`` or ``turn_timeout``).
            ServerError: the environment's step failed (its agent raised: OpenEnv's
                server answers with an error frame).
            ConnectionLostError, SessionLostError: the connection dropped (a run is
                never replayed: its captured calls would be counted twice).
            ClientClosedError: the session was closed, before or during the wait.
        """
        run = self._run
        if run is None or self._closed:
            raise ClientClosedError("the capture session is closed")

        result = wait_for_run(self.client.bridge, run, timeout_s, "capture")
        metadata = _metadata(result)
        if metadata.get("error_type") or metadata.get("error"):
            raise HarnessTurnError(str(metadata.get("error") or "the agent's run failed"),
                                   "HARNESS_ERROR", details=dict(metadata))
        return 0

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        """The captured model calls as ``TraceEntry`` dicts (OpenEnv's
        ``LoopOwningSession``), read from the proxy.

        Raises:
            CaptureProxyError: the proxy refused (an eval rollout: no token capture).
        """
        return list(self.client.bridge.call(self._proxy.trace_entries, self._key,
                                            timeout=self._proxy.timeout + 5.0,
                                            method="capture.fetch"))

    def fetch_training_trace(self) -> Any:
        """The captured model calls as OpenEnv's ``TrainingTrace`` (needs ``openenv``).

        The same checks as OpenEnv's ``to_training_trace``: a capture with fatal
        validation findings, an eval rollout, or an agent call without usable token ids
        and logprobs is refused.

        Raises:
            ValueError: the capture cannot be trained on (OpenEnv's validation).
            CaptureProxyError: the proxy refused.
            ImportError: OpenEnv is not installed.
        """
        from openenv.core.harness import TrainingTrace

        bridge = self.client.bridge
        document = bridge.call(self._proxy.rollout, self._key,
                               timeout=self._proxy.timeout + 5.0, method="capture.fetch")
        if any("[FATAL" in str(f) for f in document.get("validation") or []):
            raise ValueError("cannot train a capture with fatal validation findings: "
                             + "; ".join(str(f) for f in document["validation"]))
        if document.get("rollout_type", "train") == "eval":
            raise ValueError(
                f"the capture of rollout {self._key} is an eval rollout (capture_level="
                f"{document.get('capture_level')!r}): no token ids or logprobs to train on")
        agent_calls = {node for row in document.get("sequences") or []
                       if row.get("role") == "agent" for node in row.get("node_ids") or []}
        try:
            entries = self.fetch_proxy_trace()
        except CaptureProxyError as exc:
            raise ValueError(f"the capture of rollout {self._key} cannot be trained on: "
                             f"{exc}") from exc
        if len(entries) != len(agent_calls):
            raise ValueError("agent capture has missing or invalid engine tokens/logprobs "
                             f"({len(agent_calls) - len(entries)} of {len(agent_calls)} calls)")
        for entry in entries:
            metadata = dict(entry.get("metadata") or {})
            metadata.setdefault("capture_session_id", self._key)
            entry["metadata"] = metadata
        return TrainingTrace.from_entries(entries)

    def verify(self, transcript: list[Message], final_state: Any | None = None) -> Any:
        """Score the run.

        Returns:
            a ``VerifyResult``: the factory's ``reward(session, transcript)``, else the
            run's step reward (``None``, unscored, when it gave none or did not
            complete), ``done``, and ``metrics`` with the run's tool calls.
        """
        verify_cls = self._verify_result
        result = self._result()
        if self._factory.reward is not None:
            reward = self._factory.reward(self, transcript)
        else:
            reward = None if result is None or result.reward is None else float(result.reward)
        events = _metadata(result).get("turn_events")
        kinds = [e.get("type") for e in events if isinstance(e, Mapping)] \
            if isinstance(events, list) else []
        return verify_cls(
            env_reward=reward, done=bool(result.done) if result is not None else False,
            metrics={"model_calls": kinds.count("llm_response"),
                     "tool_calls": kinds.count("tool_call"),
                     "completed": result is not None},
            artifacts={"transcript_length": len(transcript), "capture_key": self._key},
        )

    def close(self) -> None:
        """Stop the run if it is still going, end the server session and the capture
        session (its key). Idempotent."""
        if self._closed:
            return
        self._closed = True
        run = self._run
        client = self._lease.client
        proxy, key = self._proxy, self._key

        async def stop() -> None:
            await stop_run(run)
            with contextlib.suppress(Exception):
                await proxy.delete(key)

        try:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.bridge.call(stop, timeout=proxy.timeout + 5.0,
                                       method="harness.close")
        finally:
            self._lease.release()

    def __enter__(self) -> EnvlinkCaptureSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _metadata(result: StepResult[Any] | None) -> Mapping[str, Any]:
    """The run's observation metadata (OpenEnv's ``turn_events``, ``error``...)."""
    observation = None if result is None else result.observation
    if not isinstance(observation, Mapping):
        return {}
    metadata = observation.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


async def mint_until_ready(proxy: CaptureProxy, remaining: float, *,
                           sampling: Mapping[str, Any] | None,
                           metadata: Mapping[str, Any]) -> dict[str, Any]:
    """One try at minting, bounded by what is left of the create deadline."""
    async with deadline(remaining, "capture.mint"):
        return await proxy.mint(sampling=sampling, metadata=metadata,
                                timeout=min(proxy.timeout, remaining))


AgentEnv = Callable[[str, str], Mapping[str, str]]
