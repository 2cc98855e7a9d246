"""Where a client's server comes from: a URL, a Hugging Face Space, or a provider.

:class:`Target` is what ``EnvClient(base_url=..., provider=..., token=...)``
resolves to: the URL (a Space name becomes its ``hf.space`` URL, with the token
in the client's headers), the provider's shared :class:`ProviderLease`, and
what must happen before the first connection (start the provider, wait for a
sleeping Space). :class:`Bootstrap` is the lazy handle of ``from_docker_image``
and ``from_env``: awaited, a connected client; ``.sync()``, a connected facade.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from envlink._bridge import LazyCoroutine
from envlink._errors import InvalidArgumentError, ProviderError
from envlink._launch.discovery import wait_until_ready
from envlink._launch.providers import (
    DockerProvider,
    LocalServerProvider,
    ProviderLease,
    bound_container,
    lease_for,
    one_user_call,
)
from envlink._launch.spaces import (
    hf_space_subdomain,
    hf_token,
    is_space_name,
    space_name_of,
    space_url,
)
from envlink._transports.base import parse_endpoint

if TYPE_CHECKING:
    from envlink._config import ConnectionOptions
    from envlink._sansio.policies import ReconnectPolicy
    from envlink._transports.base import Endpoint

__all__ = ["Bootstrap", "Target", "from_docker_image", "from_env", "override_space_urls"]

class _Client(Protocol):
    async def connect(self) -> Any: ...

    async def close(self) -> None: ...

    def sync(self) -> Any: ...


_C = TypeVar("_C", bound=_Client)
#: A base URL that cannot be reached, until the provider's server is started (one per
#: provider, so that per-endpoint limits count a provider's sessions together).
_NOT_STARTED = "http://provider-{:x}.invalid"
#: Test-only: Space names resolved to another (loopback) base URL.
_SPACE_OVERRIDES: dict[str, str] = {}


class override_space_urls:
    """For tests: resolve Space names to other base URLs (``{"owner/space": url}``)."""

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self._mapping = dict(mapping)
        self._saved: dict[str, str] = {}

    def __enter__(self) -> None:
        self._saved = dict(_SPACE_OVERRIDES)
        _SPACE_OVERRIDES.update(self._mapping)

    def __exit__(self, *exc: object) -> None:
        _SPACE_OVERRIDES.clear()
        _SPACE_OVERRIDES.update(self._saved)


class Target:
    """A client's server: its URL and headers, its provider, whether it is a Space."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None,
                 lease: ProviderLease | None, space: str | None, started: bool) -> None:
        self.base_url = base_url
        #: The ``base_url`` and ``token`` as the client was given them (another
        #: session on the same server resolves them again).
        self.requested: str | None = base_url
        self.token: str | None = None
        self.headers = headers
        self.lease = lease
        self.space = space
        self.started = started
        #: Set once a Space answered its health check.
        self.awake = space is None
        #: Made by ``from_docker_image`` / ``from_env`` (a bootstrap handle).
        self.bootstrapped = False
        self._held = False
        self._lock: asyncio.Lock | None = None

    @property
    def provider(self) -> Any:
        """The provider, or ``None``."""
        return self.lease.provider if self.lease is not None else None

    @classmethod
    def resolve(cls, base_url: str | None, provider: Any,
                headers: Mapping[str, str] | None, token: str | None) -> Target:
        """What ``EnvClient(base_url, provider=, headers=, token=)`` connects to.

        Raises:
            InvalidArgumentError: neither ``base_url`` nor ``provider`` (a
                ``ValueError``, as OpenEnv raises).
            ProviderError: ``provider`` is not a provider.
        """
        target = cls._resolve(base_url, provider, headers, token)
        target.requested, target.token = base_url, token
        handle = _building.get()
        if handle is not None:  # the last client a handle's build makes is the one built
            handle.target = target
        return target

    @classmethod
    def _resolve(cls, base_url: str | None, provider: Any,
                 headers: Mapping[str, str] | None, token: str | None) -> Target:
        if base_url is None and provider is None:
            # OpenEnv raises ValueError here: an OpenEnv-era `except ValueError` catches it.
            raise InvalidArgumentError(
                "EnvClient requires either base_url or provider. (base_url: a str such as "
                "'http://127.0.0.1:8000' or a Space name 'owner/space'; provider: an "
                "OpenEnv ContainerProvider or RuntimeProvider, started on connect)")
        lease = lease_for(provider, base_url) if provider is not None else None
        if base_url is None:
            assert lease is not None
            return cls(_NOT_STARTED.format(id(lease)), headers, lease, None, started=False)
        space: str | None = None
        if isinstance(base_url, str) and is_space_name(base_url.strip()):
            space = base_url.strip()
            base_url = _SPACE_OVERRIDES.get(space) or space_url(space)
        elif isinstance(base_url, str):
            space = space_name_of(base_url)
        if space is not None and not any(k.lower() == "authorization"
                                         for k in (headers or {})):
            secret = token if token is not None else hf_token()
            if secret:
                headers = {**(headers or {}), "Authorization": f"Bearer {secret}"}
        return cls(base_url, headers, lease, space, started=True)

    @property
    def held(self) -> bool:
        """Whether this client holds its provider's server (started, not released)."""
        return self._held

    @property
    def stop_pending(self) -> bool:
        """Whether a stop of this client's provider failed and is still to be done."""
        return self.lease is not None and self.lease.stop_pending

    async def prepare(self, ready_timeout: float | None) -> str | None:
        """Start the provider's server if this client does not hold it; its URL if it
        just acquired it (``None`` if it already held it).

        A pending stop of the provider is tried first (once): if it fails again, its
        error is raised unchanged and nothing starts.

        Args:
            ready_timeout: ``wait_for_ready``'s ``timeout_s``; ``None``: the provider's
                own default, as in OpenEnv.
        """
        if self.lease is None or self._held:
            return None
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._held:
                return None
            url = await self.lease.acquire(ready_timeout)
            self._held = True
            # Also after a stop and a new start: the new server may have another URL.
            self.started = True
            return url

    async def ready(self, endpoint: Endpoint, options: ConnectionOptions,
                    policy: ReconnectPolicy, *, timeout: float | None,
                    attempt_timeout: float | None,
                    ready_timeout: float | None = None) -> Endpoint | None:
        """Before a connection: start the provider's server, or wait for a sleeping Space.

        Args:
            timeout: the wait for a sleeping Space.
            ready_timeout: the provider's ``wait_for_ready`` timeout (``None``: its own).

        Returns:
            the server's endpoint when the provider's server just started, else ``None``.

        Raises:
            Exception: the provider's own error (start, readiness, or a pending stop
                that failed again), unchanged.
            NotReadyError, SpaceNotAwakeError: the server was not ready in time.
        """
        url = await self.prepare(ready_timeout)
        started = parse_endpoint(url) if url is not None else None
        if not self.awake:
            await wait_until_ready(
                started or endpoint, options, policy,
                policy.max_elapsed if policy.max_elapsed is not None else timeout,
                attempt_timeout=attempt_timeout, space=self.space)
            self.awake = True
        return started

    async def release(self) -> None:
        """The client closed: give the provider back (stopped when no client is left).

        Raises:
            Exception: the provider's stop failed (its own error, unchanged); the stop
                stays pending: :meth:`retry_stop` or the provider's next start tries it.
        """
        if self.lease is None:
            return
        if self._held:
            self._held = False
            await self.lease.release()
        else:
            # Never started here, or the start failed and so did its stop: try that
            # (unless this user call did already).
            await self.lease.retry_stop()

    async def retry_stop(self) -> None:
        """A closed client closed again: try the provider's pending stop, if any.

        Raises:
            Exception: the provider's stop failed again (unchanged).
        """
        if self.lease is not None and not self._held:
            await self.lease.retry_stop()

    def retry_stop_blocking(self) -> None:
        """:meth:`retry_stop` from a blocking caller (no event loop needed).

        Raises:
            Exception: the provider's stop failed again (unchanged).
        """
        lease = self.lease
        if lease is not None and not self._held and lease.retry_due():
            lease.stop_blocking()

    def __repr__(self) -> str:  # no headers: they may hold a token
        return f"Target(space={self.space!r}, provider={self.provider!r})"


class Bootstrap(LazyCoroutine[_C], Generic[_C]):
    """The handle ``from_docker_image`` / ``from_env`` return, as OpenEnv 0.10's.

    ``await handle`` (or ``asyncio.run(handle)``) gives the connected async client;
    ``handle.sync()`` the connected :class:`SyncEnvClient`. Nothing starts before
    that; a handle resolves once. If connecting fails, the provider is stopped.

    It is also a context manager: ``with Env.from_docker_image(...) as env`` (the
    connected :class:`SyncEnvClient`) and ``async with ... as env`` (the connected
    async client), closed, and its provider stopped, when the block ends.
    """

    def __init__(self, build: Callable[[], _C]) -> None:
        super().__init__()
        self._build = build
        self._used = False
        self._entered: Any = None
        #: The built client's :class:`Target`: a target resolved while the handle builds
        #: its client joins it (:meth:`Target.resolve`), the last one made staying.
        self.target: Target | None = None

    def _consume(self) -> _C:
        if self._used:
            raise RuntimeError("this bootstrap handle was already resolved; call the "
                               "factory again for another environment")
        self._used = True
        building = _building.set(self)
        try:
            client = self._build()
        finally:
            _building.reset(building)
        if self.target is not None:
            self.target.bootstrapped = True
        return client

    def _start(self) -> Coroutine[Any, Any, _C]:
        return self._resolve()

    async def _resolve(self) -> _C:
        client = self._consume()
        with one_user_call():  # the close after a failed connect tries no stop again
            try:
                await client.connect()
            except BaseException as exc:
                try:
                    await client.close()
                except asyncio.CancelledError:
                    pass
                except Exception as failure:
                    _note_cleanup(exc, failure)
                raise
        return client

    def sync(self) -> Any:
        """Start and connect on a background loop; return the connected facade (the
        client's ``sync()``, a :class:`~envlink.SyncEnvClient`; typed ``Any`` here, as
        this layer sits below the blocking one).

        Raises:
            ConnectError, CallTimeoutError: as ``connect()``; the provider is stopped
                first. A provider's own start or readiness error, unchanged.
        """
        client = self._consume()
        facade = client.sync()
        with one_user_call():  # the close after a failed connect tries no stop again
            try:
                facade.connect()
            except BaseException as exc:
                try:
                    facade.close()
                except Exception as failure:
                    _note_cleanup(exc, failure)
                raise
        return facade

    def __enter__(self) -> Any:
        self._entered = self.sync()
        return self._entered

    def __exit__(self, *exc: object) -> None:
        entered, self._entered = self._entered, None
        if entered is not None:
            entered.close()

    async def __aenter__(self) -> _C:
        self._entered = await self._resolve()
        return cast(_C, self._entered)

    async def __aexit__(self, *exc: object) -> None:
        entered, self._entered = self._entered, None
        if entered is not None:
            await entered.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pending (await it, or call .sync())>"


#: The bootstrap handle building its client, in this context (see :meth:`Target.resolve`).
_building: contextvars.ContextVar[Bootstrap[Any] | None] = contextvars.ContextVar(
    "envlink_bootstrap_building", default=None)


def _note_cleanup(error: BaseException, failure: Exception) -> None:
    """The connect failed, then closing failed too: say so on the connect's error (the
    one raised), so that a server left running is not hidden."""
    add = getattr(error, "add_note", None)  # Python 3.11+
    if add is not None:
        add(f"closing the client after the failed connect failed too: {failure}")


def from_docker_image(cls: type[_C], image: str, provider: Any,
                      kwargs: Mapping[str, Any]) -> Bootstrap[_C]:
    """See :meth:`EnvClient.from_docker_image`."""
    def build() -> _C:
        chosen = provider if provider is not None else DockerProvider()
        return cast(_C, cast(Any, cls)(provider=bound_container(chosen, image, kwargs)))

    return Bootstrap(build)


def from_env(cls: type[_C], repo_id: str, *, use_docker: bool, provider: Any,
             provider_kwargs: Mapping[str, Any]) -> Bootstrap[_C]:
    """See :meth:`EnvClient.from_env`."""
    if not is_space_name(repo_id):
        raise ValueError(f"repo_id must look like 'owner/space', got {repo_id!r}")
    options = dict(provider_kwargs)
    if use_docker:
        tag = options.pop("tag", "latest")
        image = f"registry.hf.space/{hf_space_subdomain(repo_id)}:{tag}"
        return from_docker_image(cls, image, provider, options)
    # As OpenEnv's: the start arguments of both kinds of provider.
    start: dict[str, Any] = {k: options.pop(k) for k in ("port", "env_vars", "workers")
                             if k in options}
    if provider is not None and options:
        raise ValueError("provider_kwargs cannot be used when supplying a provider instance")

    def build() -> _C:
        runtime = provider if provider is not None else _uv_provider(repo_id, options)
        chosen = _BoundRuntime(runtime, start) if start else runtime
        return cast(_C, cast(Any, cls)(provider=chosen))

    return Bootstrap(build)


class _BoundRuntime:
    """A runtime provider with its ``start`` arguments (``port``, ``env_vars``,
    ``workers``) bound."""

    def __init__(self, provider: Any, start: Mapping[str, Any]) -> None:
        self._provider = provider
        self._start = dict(start)

    def start(self) -> str:
        return str(self._provider.start(**self._start))

    def wait_for_ready(self, timeout_s: float | None = None) -> None:
        if timeout_s is None:
            self._provider.wait_for_ready()
        else:
            self._provider.wait_for_ready(timeout_s=timeout_s)

    def stop(self) -> None:
        self._provider.stop()


def _uv_provider(repo_id: str, options: Mapping[str, Any]) -> LocalServerProvider:
    project = options.get("project_path")
    if project is None or str(project).startswith("git+"):
        raise ProviderError(
            f"running {repo_id} without docker needs a local checkout: clone "
            f"https://huggingface.co/spaces/{repo_id} and pass project_path=, or pass "
            "provider=UVProvider(...) from openenv")
    app = str(options.get("app", "server.app:app"))
    return LocalServerProvider(["uv", "run", "--isolated", "--project", str(project), "--",
                                "uvicorn", app, "--host", "{host}", "--port", "{port}"],
                               env_vars=options.get("env_vars"))
