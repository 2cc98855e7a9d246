"""Readiness and discovery over plain HTTP: ``/health``, ``/schema``, ``/metadata``, tasks.

What consumers otherwise hand-roll around an OpenEnv server: a ``/health`` poll with
a deadline (before a container, a local process or a Hugging Face Space takes
connections), and the JSON schemas and metadata of the environment. Requests go
through :mod:`envlink._transports.http` with the client's connection options (TLS
context, proxy, headers such as ``Authorization``, size bound) to the client's own
server only; a redirect to another origin is followed without the credentials.

:func:`wait_until_ready` polls under the one retry primitive
(:class:`~envlink._sansio.retry.Retry`): the client's backoff and retry budget,
capped by the caller's deadline. A sleeping Space answers 503, or its HTML waking
page with status 200, until it is up: both are "not ready yet".

OpenEnv 0.10's Task API (``/list_environments``, ``/{env}/splits``, ``/{env}/tasks``,
``num_tasks``, ``task``, ``task_range``) is read the same way, where the server offers
it (an environment without tasks answers 501: :class:`~envlink.HttpStatusError`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, ValidationError

from envlink._config import ConnectionOptions, is_int
from envlink._deadlines import bounded
from envlink._errors import (
    CallTimeoutError,
    ConnectError,
    ConnectionLostError,
    HttpStatusError,
    NotReadyError,
    ProtocolError,
    SpaceNotAwakeError,
)
from envlink._sansio.policies import ReconnectPolicy
from envlink._sansio.retry import Retry, again
from envlink._transports.base import Endpoint
from envlink._transports.http import HttpAnswer, get_json, request_json

__all__ = ["EnvironmentMetadata", "EnvironmentSchema", "Health", "fetch", "fetch_model",
           "list_environments", "num_tasks", "splits", "task", "task_range", "tasks",
           "wait_until_ready"]

_M = TypeVar("_M", bound=BaseModel)
#: Statuses of a server that is starting (or a Space waking up): poll again.
_NOT_YET = frozenset({408, 425, 429, 500, 502, 503, 504})


class Health(BaseModel):
    """``GET /health``: OpenEnv's ``HealthResponse`` (``status`` is ``"healthy"``).

    Extra fields a server adds (envlink's reference server reports its sessions)
    are kept as attributes.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    status: str

    @property
    def healthy(self) -> bool:
        """Whether the server says it is healthy."""
        return self.status == "healthy"


class EnvironmentMetadata(BaseModel):
    """``GET /metadata``: OpenEnv's ``EnvironmentMetadata``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    description: str
    readme_content: str | None = None
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None


class EnvironmentSchema(BaseModel):
    """``GET /schema``: JSON schemas of the action, the observations and the state."""

    model_config = ConfigDict(extra="allow", frozen=True)

    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]
    reset_observation: dict[str, Any] | None = None


class _NotYet(ConnectError):
    """The server is not ready yet (refused, 503, a waking page): poll again."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message, retryable=True)
        self.status = status


def _headers(endpoint: Endpoint, options: ConnectionOptions) -> list[tuple[str, str]]:
    headers = list(options.headers)
    if endpoint.auth_header is not None and not any(
            k.lower() == "authorization" for k, _ in headers):
        headers.append(("Authorization", endpoint.auth_header))
    if options.user_agent is not None:
        headers.append(("User-Agent", options.user_agent))
    return headers


async def _get(endpoint: Endpoint, options: ConnectionOptions, path: str) -> HttpAnswer:
    # Redirects within the origin are followed; across origins the credentials are
    # dropped, and https never becomes http (the HTTP module's rule).
    return await get_json(endpoint.http_url(path), headers=_headers(endpoint, options),
                          ssl=options.ssl if endpoint.secure else None, proxy=options.proxy,
                          max_size=options.max_message_size)


async def fetch(endpoint: Endpoint, options: ConnectionOptions, path: str,
                timeout: float | None, *, body: Any = None) -> Any:
    """GET ``path`` on the server (POST ``body`` if one is given) and return its JSON body.

    Raises:
        HttpStatusError: an answer other than 200.
        ProtocolError: a 200 whose body is not JSON.
        ConnectError, ConnectionLostError: the server could not be reached.
        CallTimeoutError: ``timeout`` expired.
    """
    url = endpoint.http_url(path)
    verb = "GET" if body is None else "POST"
    try:
        async with bounded(timeout):
            if body is None:
                answer = await _get(endpoint, options, path)
            else:
                answer = await request_json(
                    "POST", url, body, headers=_headers(endpoint, options),
                    ssl=options.ssl if endpoint.secure else None, proxy=options.proxy,
                    max_size=options.max_message_size)
    except TimeoutError as exc:
        raise CallTimeoutError(f"{verb} {url} timed out after {timeout}s",
                               method=path) from exc
    if answer.status != 200:
        raise HttpStatusError(f"{verb} {url} answered HTTP {answer.status}", url=url,
                              status=answer.status)
    return answer.body


async def fetch_model(model: type[_M], endpoint: Endpoint, options: ConnectionOptions,
                      path: str, timeout: float | None) -> _M:
    """:func:`fetch`, validated as ``model``.

    Raises:
        ProtocolError: the body does not have the model's shape; and as :func:`fetch`.
    """
    body = await fetch(endpoint, options, path, timeout)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ProtocolError(
            f"GET {endpoint.http_url(path)} is not a {model.__name__}: "
            f"{exc.error_count()} field error(s)") from exc


async def wait_until_ready(endpoint: Endpoint, options: ConnectionOptions,
                           policy: ReconnectPolicy, timeout: float | None, *,
                           attempt_timeout: float | None, space: str | None = None) -> Health:
    """Poll ``GET /health`` until the server says it is healthy, or ``timeout`` ends.

    Refused connections, 5xx/429 answers and a 200 that is not the health JSON (a
    Space's waking page) are "not ready yet": polled again after the policy's
    backoff (a wait: the retry budget is not spent), until ``timeout`` (or the policy's
    ``max_elapsed`` when ``timeout`` is ``None``). The wait lasts the whole
    ``timeout``: a backoff that would pass the deadline is cut to end at it, and a
    last poll (bounded by half a second) is made then.

    Args:
        endpoint: the server.
        options: the client's connection options.
        policy: the client's reconnect policy (backoff and budget).
        timeout: seconds to wait at most.
        attempt_timeout: bound on each poll.
        space: the Space's name when the server is a Hugging Face Space (the error
            then says the Space did not wake).

    Raises:
        NotReadyError: not ready when the deadline ended (``SpaceNotAwakeError``
            for a Space).
        HttpStatusError: a status that waiting will not change (401, 403, 404...).
        RetryBudgetExhaustedError: the shared budget refused a retry.
    """
    url = endpoint.http_url("/health")
    limit = timeout if timeout is not None else policy.max_elapsed
    polling = dataclasses.replace(policy, max_elapsed=None)
    loop = asyncio.get_running_loop()
    deadline = None if limit is None else loop.time() + limit
    # The wait lasts until its deadline: backoffs are cut to end there and the last
    # poll is made then (given at least LAST_TRY), never a backoff skipped to give up early.
    # A wait, not a retry of a failure: no try cap, and the retry budget is not spent.
    retry = Retry(polling, operation="ready", sleep=asyncio.sleep, clock=loop.time,
                  retry_on=lambda exc: isinstance(exc, _NotYet), deadline=deadline,
                  waiting=True)
    last: list[_NotYet] = []

    async def poll(_attempt: int) -> Health:
        bound, left = attempt_timeout, retry.time_for_try()
        if left is not None:
            bound = left if bound is None else min(bound, left)
        try:
            async with bounded(bound):
                answer = await _get(endpoint, options, "/health")
        except (TimeoutError, ConnectionLostError, ProtocolError) as exc:
            raise _not_yet(last, f"{type(exc).__name__}: {exc}", None) from exc
        except ConnectError as exc:
            if not exc.retryable:
                raise
            raise _not_yet(last, str(exc), None) from exc
        if answer.status in _NOT_YET:
            raise _not_yet(last, f"HTTP {answer.status}", answer.status)
        if answer.status != 200:
            raise HttpStatusError(f"GET {url} answered HTTP {answer.status}", url=url,
                                  status=answer.status)
        try:
            health = Health.model_validate(answer.body)
        except ValidationError as exc:
            raise _not_yet(last, "a 200 answer that is not the health JSON", 200) from exc
        if not health.healthy:
            raise _not_yet(last, f"status {health.status!r}", 200)
        return health

    try:
        return await retry.run(poll)
    except _NotYet as exc:
        seen = last[-1] if last else None
        what = seen.args[0] if seen is not None else "no answer"
        waited = f"within {limit:g}s" if limit is not None else "before the policy gave up"
        status = seen.status if seen is not None else None
        if space is not None:
            raise SpaceNotAwakeError(
                f"the Hugging Face Space {space} did not wake up {waited} "
                f"(last answer: {what}); try again later, or wait longer", url=url,
                attempts=retry.tries, last_status=status) from exc
        raise NotReadyError(f"{url} was not ready {waited} (last answer: {what})",
                            url=url, attempts=retry.tries, last_status=status) from exc


def _not_yet(seen: list[_NotYet], what: str, status: int | None) -> Exception:
    error = _NotYet(what, status)
    seen.append(error)
    del seen[:-1]
    return again(error)


async def list_environments(endpoint: Endpoint, options: ConnectionOptions,
                            timeout: float | None) -> list[str]:
    """``GET /list_environments`` (Task API): the names of the served environments.

    Raises:
        ProtocolError: the answer is not a list of names; and as :func:`fetch`.
    """
    names = await fetch(endpoint, options, "/list_environments", timeout)
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise ProtocolError("GET /list_environments did not answer a list of names")
    return names


async def splits(endpoint: Endpoint, options: ConnectionOptions, timeout: float | None,
                 env_name: str | None) -> list[dict[str, Any]]:
    """``GET /{env}/splits`` (Task API): the task splits, ``{"name", "type", ...}``.

    Raises:
        HttpStatusError: 501 when the environment has no tasks; as :func:`fetch`.
    """
    answer = await _task_json(endpoint, options, "splits", None, timeout, env_name)
    if not (isinstance(answer, list) and all(isinstance(x, dict) for x in answer)):
        raise ProtocolError("the splits answer is not a list of objects")
    return answer


async def num_tasks(endpoint: Endpoint, options: ConnectionOptions, split: str,
                    timeout: float | None, env_name: str | None) -> int:
    """``POST /{env}/num_tasks`` (Task API): how many tasks ``split`` has.

    Raises:
        As :func:`splits`.
    """
    answer = await _task_json(endpoint, options, "num_tasks", {"split": split}, timeout,
                              env_name)
    count = answer.get("num_tasks") if isinstance(answer, dict) else None
    if not is_int(count):
        raise ProtocolError("the num_tasks answer has no integer num_tasks")
    return count


async def tasks(endpoint: Endpoint, options: ConnectionOptions, split: str,
                timeout: float | None, env_name: str | None) -> list[Any]:
    """``POST /{env}/tasks`` (Task API): every task of ``split``.

    Raises:
        As :func:`splits`.
    """
    return _task_list(await _task_json(endpoint, options, "tasks", {"split": split}, timeout,
                                       env_name))


async def task(endpoint: Endpoint, options: ConnectionOptions, split: str, index: int,
               timeout: float | None, env_name: str | None) -> Any:
    """``POST /{env}/task`` (Task API): task ``index`` of ``split``.

    Raises:
        HttpStatusError: 400 for an index outside the split; as :func:`splits`.
    """
    answer = await _task_json(endpoint, options, "task", {"split": split, "index": index},
                              timeout, env_name)
    if not isinstance(answer, dict) or "task" not in answer:
        raise ProtocolError("the task answer has no task")
    return answer["task"]


async def task_range(endpoint: Endpoint, options: ConnectionOptions, split: str, start: int,
                     stop: int, timeout: float | None, env_name: str | None) -> list[Any]:
    """``POST /{env}/task_range`` (Task API): tasks ``start`` to ``stop`` of ``split``.

    Raises:
        As :func:`splits`.
    """
    body = {"split": split, "start": start, "stop": stop}
    return _task_list(await _task_json(endpoint, options, "task_range", body, timeout,
                                       env_name))


async def _task_json(endpoint: Endpoint, options: ConnectionOptions, route: str, body: Any,
                     timeout: float | None, env_name: str | None) -> Any:
    if env_name is None:
        names = await fetch(endpoint, options, "/list_environments", timeout)
        if not (isinstance(names, list) and len(names) == 1 and isinstance(names[0], str)):
            raise ProtocolError("the server does not name exactly one environment: "
                                "pass env_name=")
        env_name = names[0]
    path = f"/{quote(env_name, safe='')}/{route}"
    return await fetch(endpoint, options, path, timeout, body=body)


def _task_list(answer: Any) -> list[Any]:
    found = answer.get("tasks") if isinstance(answer, dict) else None
    if not isinstance(found, list):
        raise ProtocolError("the tasks answer has no list of tasks")
    return found
