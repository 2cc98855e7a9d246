"""OpenEnv 0.10's Task API, reached as ``client.tasks``: the splits and tasks a server offers.

Plain HTTP reads to the client's own server (``GET /list_environments``,
``GET /{env}/splits``, ``POST /{env}/num_tasks | tasks | task | task_range``), with
the client's TLS context, proxy, headers and call deadline; no session is opened.
The methods take OpenEnv's names (those of an environment's ``list_tasks``,
``num_tasks``, ``get_task``, ``get_task_range`` and of its Harbor client's
``splits``). Each call runs as the client's own methods do: awaited in async code,
blocking in plain code, and blocking on the client's sync facade
(``client.sync().tasks``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from envlink._bridge.dispatch import dispatch_call
from envlink._config import UNSET, UnsetType
from envlink._launch import discovery

if TYPE_CHECKING:
    from envlink._config import ConnectionOptions
    from envlink._transports.base import Endpoint


class _Client(Protocol):
    """What the Task API reads of its client (an ``EnvClient``): its server's endpoint,
    its connection options, and the check and deadline before a plain-HTTP read."""

    _endpoint: Endpoint
    _options: ConnectionOptions

    async def _before_http(self, timeout: float | UnsetType | None) -> float | None: ...

__all__ = ["TaskAPI"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


async def _list_environments(client: _Client, *,
                             timeout: float | UnsetType | None = UNSET) -> list[str]:
    """``GET /list_environments``: the names of the served environments.

    Raises:
        HttpStatusError: the server answered another status than 200.
        ProtocolError: the answer is not a list of names.
        ConnectError, ConnectionLostError, CallTimeoutError, ClientClosedError.
    """
    seconds = await client._before_http(timeout)
    names: list[str] = await discovery.list_environments(client._endpoint, client._options,
                                                         seconds)
    return names


async def _splits(client: _Client, *, env_name: str | None = None,
                  timeout: float | UnsetType | None = UNSET) -> list[dict[str, Any]]:
    """``GET /{env}/splits``: the task splits, ``{"name", "type", ...}``.

    Args:
        env_name: the environment (default: the server's only one).
        timeout: deadline in seconds (default: the client's call timeout).

    Raises:
        HttpStatusError: 501 when the environment has no tasks, 404 for another
            environment's name; as :meth:`list_environments`.
    """
    seconds = await client._before_http(timeout)
    found: list[dict[str, Any]] = await discovery.splits(client._endpoint, client._options,
                                                         seconds, env_name)
    return found


async def _num_tasks(client: _Client, split: str = "", *, env_name: str | None = None,
                     timeout: float | UnsetType | None = UNSET) -> int:
    """``POST /{env}/num_tasks``: how many tasks ``split`` has (default: the default split).

    Raises:
        HttpStatusError: 400 for an unknown split; as :meth:`splits`.
    """
    seconds = await client._before_http(timeout)
    count: int = await discovery.num_tasks(client._endpoint, client._options, split, seconds,
                                           env_name)
    return count


async def _list_tasks(client: _Client, split: str = "", *, env_name: str | None = None,
                      timeout: float | UnsetType | None = UNSET) -> list[Any]:
    """``POST /{env}/tasks``: every task of ``split``.

    Raises:
        As :meth:`num_tasks`.
    """
    seconds = await client._before_http(timeout)
    tasks: list[Any] = await discovery.tasks(client._endpoint, client._options, split,
                                             seconds, env_name)
    return tasks


async def _get_task(client: _Client, split: str, index: int, *, env_name: str | None = None,
                    timeout: float | UnsetType | None = UNSET) -> Any:
    """``POST /{env}/task``: task ``index`` of ``split`` (often a reset's arguments).

    Raises:
        HttpStatusError: 400 for an index outside the split; as :meth:`num_tasks`.
    """
    seconds = await client._before_http(timeout)
    return await discovery.task(client._endpoint, client._options, split, index, seconds,
                                env_name)


async def _get_task_range(client: _Client, split: str, start: int = 0, stop: int = 20, *,
                          env_name: str | None = None,
                          timeout: float | UnsetType | None = UNSET) -> list[Any]:
    """``POST /{env}/task_range``: tasks ``start`` to ``stop`` of ``split``.

    Raises:
        As :meth:`num_tasks`.
    """
    seconds = await client._before_http(timeout)
    tasks: list[Any] = await discovery.task_range(client._endpoint, client._options, split,
                                                  start, stop, seconds, env_name)
    return tasks


def _task_call(fn: Callable[Concatenate[_Client, _P], Coroutine[Any, Any, _R]]
               ) -> Callable[Concatenate[TaskAPI, _P], Coroutine[Any, Any, _R]]:
    """The :class:`TaskAPI` method of ``fn``, a coroutine function of the client.

    The method is dispatched as the client's own; its coroutine method (what a sync
    facade runs on its bridge) is its ``_envlink_raw``, as for a dispatched method.
    """
    name = fn.__name__.lstrip("_")

    def method(self: TaskAPI, /, *args: _P.args, **kwargs: _P.kwargs
               ) -> Coroutine[Any, Any, _R]:
        result: Coroutine[Any, Any, _R] = dispatch_call(self._client, fn, f"tasks.{name}",
                                                        args, kwargs)
        return result

    async def coroutine(self: TaskAPI, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return await fn(self._client, *args, **kwargs)

    # help() and IDEs show the method's own signature, not the function's first argument.
    sig = inspect.signature(fn)
    first, *rest = sig.parameters.values()
    own = sig.replace(
        parameters=[first.replace(name="self", annotation=inspect.Parameter.empty), *rest])
    for made in (method, coroutine):
        functools.update_wrapper(made, fn)
        made.__signature__ = own  # type: ignore[attr-defined]
        made.__name__ = name
        made.__qualname__ = f"TaskAPI.{name}"
    method._envlink_raw = coroutine  # type: ignore[attr-defined]
    return method


class TaskAPI:
    """The Task API of a client's server: ``client.tasks``, ``client.sync().tasks``.

    Every call takes ``env_name=`` (default: the server's only environment) and
    ``timeout=`` (default: the client's call timeout), and raises the client's typed
    errors: an environment without tasks answers 501, an unknown split or an index
    outside it 400, each an :class:`~envlink.HttpStatusError` with ``.status``.

    Example::

        async with GenericEnvClient(base_url=url) as env:
            task = await env.tasks.get_task("train", 3)
            await env.reset(**task)
    """

    __slots__ = ("_client",)

    def __init__(self, client: _Client) -> None:
        self._client = client

    list_environments = _task_call(_list_environments)
    splits = _task_call(_splits)
    num_tasks = _task_call(_num_tasks)
    list_tasks = _task_call(_list_tasks)
    get_task = _task_call(_get_task)
    get_task_range = _task_call(_get_task_range)

    def __repr__(self) -> str:
        return f"<TaskAPI of {self._client!r}>"
