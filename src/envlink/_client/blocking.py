"""The client's blocking facade (``client.sync()``), as the client sees it: the
:class:`SyncEnv` protocol, and the hook that builds one.

The facade (:class:`~envlink.SyncEnvClient`) lives in the blocking layer, which the client
does not import: ``envlink`` installs its builder with :func:`set_sync_facade` when it is
imported, as it installs the bridge's telemetry.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from envlink._config import UNSET, UnsetType
from envlink._sansio.protocol import StepResult

if TYPE_CHECKING:
    from envlink._bridge import Bridge

__all__ = ["SyncEnv", "SyncFacadeFactory", "make_sync_facade", "set_sync_facade"]

_ActT = TypeVar("_ActT", contravariant=True)
_ObsT = TypeVar("_ObsT")
_StateT = TypeVar("_StateT", covariant=True)


class SyncEnv(Protocol[_ActT, _ObsT, _StateT]):
    """A client's blocking facade: the client's calls, each blocking on a bridge (an
    :class:`~envlink.SyncEnvClient`; see it for every method's rules). Any other coroutine
    method of the client is there too, in blocking form, through attribute access."""

    @property
    def bridge(self) -> Bridge: ...
    @property
    def async_client(self) -> Any: ...
    @property
    def tasks(self) -> Any: ...

    def connect(self, *, timeout: float | UnsetType | None = UNSET
                ) -> SyncEnv[_ActT, _ObsT, _StateT]: ...
    def reset(self, *, timeout: float | UnsetType | None = UNSET,
              **kwargs: Any) -> StepResult[_ObsT]: ...
    def step(self, action: _ActT, *, timeout: float | UnsetType | None = UNSET,
             **kwargs: Any) -> StepResult[_ObsT]: ...
    def state(self, *, timeout: float | UnsetType | None = UNSET) -> _StateT: ...
    def disconnect(self, *, timeout: float | UnsetType | None = UNSET) -> None: ...
    def new_session(self) -> SyncEnv[_ActT, _ObsT, _StateT]: ...
    def close(self, *, timeout: float | UnsetType | None = UNSET,
              final: bool = False) -> None: ...
    def __enter__(self) -> SyncEnv[_ActT, _ObsT, _StateT]: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]: ...
    def __getattr__(self, name: str) -> Any: ...


#: Builds a client's facade: ``factory(client, bridge, nested_spans)``.
SyncFacadeFactory = Callable[[Any, "Bridge | None", bool], Any]

_factory: SyncFacadeFactory | None = None


def set_sync_facade(factory: SyncFacadeFactory) -> None:
    """Install what ``client.sync()`` builds (``envlink`` installs the blocking layer's
    :class:`~envlink.SyncEnvClient` when it is imported)."""
    global _factory
    _factory = factory


def make_sync_facade(client: Any, bridge: Bridge | None, nested_spans: bool) -> Any:
    """The blocking facade of ``client`` from the installed builder.

    Raises:
        RuntimeError: no builder is installed (``envlink`` was not imported).
    """
    factory = _factory
    if factory is None:
        raise RuntimeError("no blocking facade is installed: import envlink first")
    return factory(client, bridge, nested_spans)
