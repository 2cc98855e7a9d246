"""A base class for TRL's ``GRPOTrainer(environment_factory=...)``, on envlink.

TRL builds environments with no arguments, keeps them in a pool (one per concurrent
rollout), calls ``reset(**row)`` before each rollout with every dataset column, and
offers every *public plain function of the class* to the model as a tool (its schema
from the type hints and the ``Args:`` docstring, ``transformers.utils.get_json_schema``).
An exception from ``reset`` stops ``train()``; a tool's exception becomes
``{"error": str(e)}`` in the transcript; TRL never closes an environment.

:class:`EnvlinkEnvironment` is shaped for exactly that:

- it *holds* a client (the :attr:`~EnvlinkEnvironment.client` property) instead of
  subclassing one, and every helper it has is private or a property, so TRL's tool
  discovery sees only the subclass's own tools;
- ``__init__`` takes no arguments and opens nothing; the first ``reset`` connects;
- ``reset`` recovers from a dropped connection and waits for a full server, under a
  deadline (:attr:`~EnvlinkEnvironment.reset_timeout`), so a blip never ends a run;
  tools recover mid-episode through ``on_session_lost="auto"``;
- sessions are released when TRL drops an instance (``weakref.finalize``) and at
  exit, and optionally after every episode (:attr:`~EnvlinkEnvironment.session_mode`);
- instances pickle as their configuration (TRL's async trainer spawns a child);
- every instance in a process shares one loop thread.

TRL itself is not imported here: this module works, and is tested, without it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from envlink._client.client import EnvClient, GenericEnvClient, StepResult, configured_client
from envlink._client.configuration import ClientConfig
from envlink._errors import ToolCallError
from envlink.integrations._runtime import (
    DEFAULT_CLIENT_CONFIG,
    Lease,
    adapter_config,
    reset_until_ready,
    shared_bridge,
)

__all__ = ["DEFAULT_CLIENT_CONFIG", "EnvlinkEnvironment", "SessionMode"]

#: ``"keep"``: one server session per instance, reused across episodes; ``"release"``:
#: the session is ended after each episode's ``get_reward`` and reopened by the next reset.
SessionMode = Literal["keep", "release"]

_URL_ENV = "ENVLINK_URL"
_RESET_TIMEOUT_ENV = "ENVLINK_RESET_TIMEOUT"
_SESSION_MODE_ENV = "ENVLINK_SESSION_MODE"


class EnvlinkEnvironment:
    """Base class of an environment for TRL's ``environment_factory``.

    Subclass it, set :attr:`base_url` (or the ``ENVLINK_URL`` environment variable),
    and write each tool as an ordinary typed method with a docstring::

        class Echo(EnvlinkEnvironment):
            base_url = "http://127.0.0.1:8000"

            def echo(self, message: str) -> str:
                \"\"\"Echo a message through the environment.

                Args:
                    message: the text to echo.
                \"\"\"
                return self._step({"message": message}).observation["echoed_message"]

            def get_reward(self) -> float:
                return self.episode_reward

        trainer = GRPOTrainer(..., environment_factory=Echo)

    Tools may be ``async def`` (TRL gathers them on its own loop): await
    :meth:`_astep` / :meth:`_acall_tool` there. Errors are raised, never returned as
    text: TRL records ``str(error)`` as the tool's result.

    Class attributes (each also settable per instance through ``__init__``'s
    keyword arguments, e.g. with ``functools.partial``):

    Attributes:
        base_url: the server (``http(s)://`` or ``ws(s)://``); default: the
            ``ENVLINK_URL`` environment variable.
        client_class: the :class:`~envlink.EnvClient` subclass to build.
        client_config: the :class:`~envlink.ClientConfig` of its client, given
            exactly; default :data:`DEFAULT_CLIENT_CONFIG`: ``on_session_lost="auto"``
            (resume where the server can, else replay) and ``on_capacity="wait"``.
        client_options: deprecated: the client's keyword arguments as a mapping, over
            those two defaults, made into a ``client_config`` once per client.
        reset_timeout: seconds a ``reset`` may spend waiting for capacity and
            reconnecting before it raises (default 120, or ``ENVLINK_RESET_TIMEOUT``).
        session_mode: ``"keep"`` (default, or ``ENVLINK_SESSION_MODE``) keeps one
            session per instance across episodes; ``"release"`` ends it after each
            episode's ``get_reward`` so no session sits idle through optimizer steps.
        reset_columns: the dataset columns passed on as reset arguments by the
            default :meth:`_reset_kwargs` (default ``("seed", "episode_id")``).
    """

    base_url: ClassVar[str | None] = None
    client_class: ClassVar[type[EnvClient[Any, Any, Any]]] = GenericEnvClient
    client_config: ClassVar[ClientConfig | None] = None
    client_options: ClassVar[Mapping[str, Any]] = {}
    reset_timeout: ClassVar[float | None] = None
    session_mode: ClassVar[SessionMode | None] = None
    reset_columns: ClassVar[tuple[str, ...]] = ("seed", "episode_id")

    def __init__(self, **overrides: Any) -> None:
        """Build the environment; nothing is connected until the first ``reset``.

        Args:
            **overrides: per-instance values of the class attributes above
                (``base_url``, ``client_config``, ``client_options``, ``reset_timeout``,
                ``session_mode``, ``reset_columns``).

        Raises:
            TypeError: an override that is not one of those attributes.
        """
        unknown = set(overrides) - _OVERRIDABLE
        if unknown:
            raise TypeError(f"unknown setting(s) for {type(self).__name__}: "
                            f"{', '.join(sorted(unknown))}")
        self._envlink_overrides = dict(overrides)
        self._envlink_setup()

    def _envlink_setup(self) -> None:
        self._envlink_lease = Lease()
        self._envlink_last: StepResult[Any] | None = None
        self._envlink_reward = 0.0
        # TRL never closes its environments: release the session when the instance
        # is garbage collected (and, through the lease registry, at exit).
        self._envlink_finalizer = weakref.finalize(self, self._envlink_lease.release)

    # ------------------------------------------------------------------ pickling

    def __getstate__(self) -> dict[str, Any]:
        # The configuration travels, never the connection: TRL's async trainer pickles
        # the factory into a spawned child, which connects on its own first reset.
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_envlink")}
        state["_envlink_overrides"] = dict(self._envlink_overrides)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._envlink_setup()

    # ------------------------------------------------------------------ settings

    def _setting(self, name: str) -> Any:
        if name in self._envlink_overrides:
            return self._envlink_overrides[name]
        return getattr(type(self), name)

    @property
    def url(self) -> str:
        """The server this instance talks to.

        Raises:
            ValueError: neither ``base_url`` nor ``ENVLINK_URL`` is set.
        """
        url = self._setting("base_url") or os.environ.get(_URL_ENV)
        if not url:
            raise ValueError(f"{type(self).__name__}: set base_url on the class, pass "
                             f"base_url=..., or set the {_URL_ENV} environment variable")
        return str(url)

    @property
    def effective_reset_timeout(self) -> float:
        """Seconds a reset may take, from the class, the instance or ``ENVLINK_RESET_TIMEOUT``."""
        value = self._setting("reset_timeout")
        if value is None:
            value = float(os.environ.get(_RESET_TIMEOUT_ENV, "120"))
        return float(value)

    @property
    def effective_session_mode(self) -> SessionMode:
        """``"keep"`` or ``"release"``, from the class, the instance or ``ENVLINK_SESSION_MODE``.

        Raises:
            ValueError: any other value.
        """
        mode = self._setting("session_mode") or os.environ.get(_SESSION_MODE_ENV, "keep")
        if mode not in ("keep", "release"):
            raise ValueError(f"session_mode must be 'keep' or 'release', got {mode!r}")
        return "release" if mode == "release" else "keep"

    # ------------------------------------------------------------------ the client

    @property
    def client(self) -> Any:
        """The blocking client (a :class:`~envlink.SyncEnvClient`), built on first use.

        Runs on the process-wide loop thread shared by every instance.
        """
        lease = self._envlink_lease
        if lease.client is None:
            config = adapter_config(self._setting("client_config"),
                                    self._setting("client_options"))
            lease.client = configured_client(self.client_class, self.url, config).sync(
                shared_bridge())
        return lease.client

    @property
    def last_result(self) -> StepResult[Any] | None:
        """The last reset or step result of this episode (``None`` before the first reset)."""
        return self._envlink_last

    @property
    def episode_reward(self) -> float:
        """The sum of the rewards of this episode's steps so far."""
        return self._envlink_reward

    # ------------------------------------------------------------------ TRL's contract

    def reset(self, **row: Any) -> str | list[Any] | None:
        """Start an episode for one dataset row (TRL calls this before each rollout).

        The row's columns become reset arguments through :meth:`_reset_kwargs`, and the
        answer becomes the text TRL appends to the prompt through :meth:`_observation`.
        A dropped connection is reopened and a full server is waited for, until
        :attr:`reset_timeout`.

        Args:
            **row: every column of the dataset row.

        Raises:
            EnvlinkError: the reset failed for a reason that does not pass (a
                rejected handshake, a validation error), or the deadline expired.
        """
        client = self.client
        deadline = self.effective_reset_timeout
        kwargs = self._reset_kwargs(row)
        result: StepResult[Any] = client.bridge.call(
            reset_until_ready, client.async_client, kwargs, deadline=deadline,
            timeout=deadline + 5.0, method="reset")
        self._envlink_last = result
        self._envlink_reward = 0.0
        return self._observation(result, row)

    def _reset_kwargs(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The reset arguments for a dataset row (override to map columns).

        Args:
            row: every column of the row.

        Returns:
            the columns named in :attr:`reset_columns` that the row has.
        """
        return {k: row[k] for k in self._setting("reset_columns") if k in row}

    def _observation(self, result: StepResult[Any], row: Mapping[str, Any]
                     ) -> str | list[Any] | None:
        """What TRL appends to the prompt after a reset (override; default: nothing).

        Args:
            result: the reset's result.
            row: the dataset row.
        """
        return None

    def _release(self) -> None:
        """End this instance's server session now; the next reset opens a new one."""
        self._envlink_lease.release()

    # ------------------------------------------------------------------ for tools

    def _step(self, action: Any) -> StepResult[Any]:
        """Apply an action (from a sync tool); the reward adds to :attr:`episode_reward`.

        Raises:
            EnvlinkError: as ``SyncEnvClient.step`` (raise it: TRL records its text).
        """
        result: StepResult[Any] = self.client.step(action)
        self._envlink_last = result
        if result.reward is not None:
            self._envlink_reward += float(result.reward)
        return result

    def _call_tool(self, name: str, **arguments: Any) -> Any:
        """Call an MCP tool of the environment (OpenEnv's ``call_tool`` action).

        Returns:
            the tool's result.

        Raises:
            ToolCallError: the environment answered with an error for the call.
            EnvlinkError: as :meth:`_step`.
        """
        action = {"type": "call_tool", "tool_name": name, "arguments": arguments}
        return _tool_value(name, self._step(action).observation)

    async def _astep(self, action: Any) -> StepResult[Any]:
        """:meth:`_step` for ``async def`` tools (awaitable on any event loop).

        Raises:
            EnvlinkError: as :meth:`_step`.
        """
        return await asyncio.to_thread(self._step, action)

    async def _acall_tool(self, name: str, **arguments: Any) -> Any:
        """:meth:`_call_tool` for ``async def`` tools.

        Raises:
            ToolCallError, EnvlinkError: as :meth:`_call_tool`.
        """
        return await asyncio.to_thread(functools.partial(self._call_tool, name, **arguments))

    # ------------------------------------------------------------------ release mode

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        reward = cls.__dict__.get("get_reward")
        if reward is None or getattr(reward, "_envlink_wrapped", False):
            return
        # "release" ends the session once the episode is scored (TRL calls get_reward
        # once per finished rollout), so no session idles through the optimizer step.
        if inspect.iscoroutinefunction(reward):
            @functools.wraps(reward)
            async def scored_async(self: EnvlinkEnvironment) -> Any:
                try:
                    return await reward(self)
                finally:
                    if self.effective_session_mode == "release":
                        await asyncio.to_thread(self._release)

            wrapped: Callable[..., Any] = scored_async
        else:
            @functools.wraps(reward)
            def scored(self: EnvlinkEnvironment) -> Any:
                try:
                    return reward(self)
                finally:
                    if self.effective_session_mode == "release":
                        self._release()

            wrapped = scored
        wrapped._envlink_wrapped = True  # type: ignore[attr-defined]
        cls.get_reward = wrapped  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        connected = self._envlink_lease.client is not None
        url = self._setting("base_url") or os.environ.get(_URL_ENV, "?")
        return f"<{type(self).__name__} {url} {'connected' if connected else 'idle'}>"


_OVERRIDABLE = frozenset({"base_url", "client_config", "client_options", "reset_timeout",
                          "session_mode", "reset_columns"})


def _tool_value(name: str, observation: Any) -> Any:
    """The result of a ``call_tool`` observation, or the typed error it reports."""
    if not isinstance(observation, Mapping):
        return observation
    error = observation.get("error")
    if error:
        if isinstance(error, Mapping):
            message = str(error.get("message") or error)
            kind = str(error.get("error_type") or "tool_error")
        else:
            message, kind = str(error), "tool_error"
        raise ToolCallError(f"tool {name!r} failed: {message}", kind, tool_name=name)
    return observation.get("result", observation)
