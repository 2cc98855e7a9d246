"""Sessions that move between processes: ``client.detach()`` → :class:`SessionHandle` →
``EnvClient.attach(handle)``.

Detaching ends the client but not its server session: the connection is closed
without the protocol's ``close`` request, so the server keeps the session (an
envlink server for its resume grace window, an OpenEnv 0.10 server as the detached
session it created). The handle carries what another process needs to continue:
the endpoint, the session's identity, the resume secret and the episode's journal.
Attaching builds a client whose episode is that journal and whose connection is
lost, and re-attaches at once through the client's own resume recovery: the same
server session, steps of unknown outcome settled from the server's ``step_count``,
so a step is never applied twice. A session the server no longer has raises
:class:`~envlink.SessionGoneError` with the journal.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from envlink._bridge.dispatch import dispatch_call
from envlink._client.configuration import ClientConfig
from envlink._client.driver import end_turn, take_turn, wait_turn
from envlink._config import UNSET, UnsetType, is_int
from envlink._errors import (
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    SessionGoneError,
    SessionLostError,
)
from envlink._sansio.journal import EpisodeJournal, JournalEntry
from envlink._sansio.policies import RecoveryMechanism
from envlink._sansio.session import Call, Episode

if TYPE_CHECKING:
    from envlink._bridge import Bridge
    from envlink._client.blocking import SyncEnv
    from envlink._client.client import EnvClient
    from envlink._client.driver import SessionDriver

__all__ = ["SessionHandle", "attach", "detach"]

_C = TypeVar("_C", bound="EnvClient[Any, Any, Any]")
_FORMAT = 1
#: The mechanisms a handle may carry: a session moves only where it can be resumed.
_RESUMABLE = (RecoveryMechanism.ENVLINK_RESUME, RecoveryMechanism.OPENENV_RESUME)


@dataclass(frozen=True)
class SessionHandle:
    """A detached server session, to continue in another process.

    Picklable, and JSON-serialisable with :meth:`to_json` / :meth:`from_json`. Its
    ``repr`` and ``str`` never show the resume secret; the serialised forms carry
    it (they must, to resume): treat them as you treat a credential. Headers such
    as ``Authorization`` are not part of it: pass them again to ``attach``.

    Attributes:
        base_url: the server's base URL (no credentials).
        session_id: the server session's public id.
        mechanism: ``"envlink-resume"`` (an envlink server, by resume token) or
            ``"openenv-resume"`` (an OpenEnv 0.10 detached session).
        journal: the episode so far (a copy).
    """

    base_url: str
    session_id: str | None
    mechanism: str
    journal: EpisodeJournal = field(compare=False)
    detached_id: str | None = field(default=None, repr=False)
    resume_token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return (f"SessionHandle(base_url={self.base_url!r}, session_id={self.session_id!r}, "
                f"mechanism={self.mechanism!r}, steps={self.journal.step_count})")

    __str__ = __repr__

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form (with the resume secret)."""
        j = self.journal
        return {
            "format": _FORMAT, "base_url": self.base_url, "session_id": self.session_id,
            "mechanism": self.mechanism, "detached_id": self.detached_id,
            "resume_token": self.resume_token,
            "journal": {
                "reset_kwargs": j.reset_kwargs, "reset_response_json": j.reset_response_json,
                "entries": [[e.action_json, e.response_json] for e in j.entries],
                "max_steps": j.max_steps, "truncated": j.truncated,
                "episode_id": j.episode_id, "unknown_steps": list(j.unknown_steps),
                "steps_applied": j.steps_applied, "keep_steps": j.keep_steps,
            },
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionHandle:
        """Rebuild a handle from :meth:`to_dict`.

        Raises:
            ValueError: ``data`` is not a serialised handle.
        """
        try:
            if data.get("format") != _FORMAT:
                raise ValueError(f"unknown session handle format {data.get('format')!r}")
            j = data["journal"]
            journal = EpisodeJournal(
                reset_kwargs=dict(j["reset_kwargs"]),
                reset_response_json=j["reset_response_json"],
                entries=[JournalEntry(a, r) for a, r in j["entries"]],
                max_steps=int(j["max_steps"]), truncated=bool(j["truncated"]),
                episode_id=j["episode_id"], unknown_steps=list(j["unknown_steps"]),
                _unknown_ids=[None] * len(j["unknown_steps"]),
                steps_applied=int(j["steps_applied"]),
                keep_steps=bool(j.get("keep_steps", True)))
            handle = cls(base_url=str(data["base_url"]), session_id=data["session_id"],
                         mechanism=str(data["mechanism"]), journal=journal,
                         detached_id=data["detached_id"], resume_token=data["resume_token"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a serialised envlink session handle: {exc!r}") from None
        if handle.mechanism not in _RESUMABLE:
            raise ValueError(f"unknown session handle mechanism {handle.mechanism!r}")
        return handle

    @classmethod
    def from_json(cls, text: str) -> SessionHandle:
        """Rebuild a handle from :meth:`to_json`.

        Raises:
            ValueError: ``text`` is not a serialised handle.
        """
        return cls.from_dict(json.loads(text))

    def attach_sync(self, *, bridge: Bridge | None = None,
                    timeout: float | UnsetType | None = UNSET,
                    **options: Any) -> SyncEnv[Any, Any, Any]:
        """Blocking :meth:`EnvClient.attach` with a :class:`~envlink.GenericEnvClient`.

        Args:
            bridge: run on this bridge (default: :func:`~envlink.default_bridge`).
            timeout: deadline of the attach (default: the client's call deadline).
            **options: keyword arguments of the client (``headers=``...).

        Raises:
            SessionGoneError: the server no longer has the session (with the journal).
        """
        from envlink._client.client import GenericEnvClient

        client = _client_for(GenericEnvClient, self, options)
        facade = client.sync(bridge)
        seconds = client.call_deadline("state", timeout)
        try:
            facade.bridge.call(_resume, client, self, timeout,
                               timeout=None if seconds is None else 2 * seconds + 1.0,
                               method="attach")
        except BaseException:
            facade.close()
            raise
        return facade


def _client_for(cls: type[_C], handle: SessionHandle, options: dict[str, Any]) -> _C:
    if not isinstance(handle, SessionHandle):
        raise TypeError(f"attach() needs a SessionHandle, got {type(handle).__name__}")
    config = options.pop("config", None)
    if config is None:
        options.setdefault("on_session_lost", "resume")
        return cls(handle.base_url, **options)
    if options:
        raise ValueError(f"pass the configuration either as config= or as keyword "
                         f"arguments, not both (got {', '.join(sorted(options))})")
    from envlink._client.client import configured_client

    if isinstance(config, ClientConfig) and config.on_session_lost == "raise":
        # A client that raises on a lost session could never re-attach.
        config = dataclasses.replace(config, on_session_lost="resume")
    return configured_client(cls, handle.base_url, config)


async def _resume(client: EnvClient[Any, Any, Any], handle: SessionHandle,
                  timeout: float | UnsetType | None = UNSET) -> None:
    """Give ``client`` the handle's episode, its connection lost, and resume it now.

    On the loop the client will run on: a client first used on a loop starts there
    with no episode, so the episode is restored once it is bound.
    """
    journal = client._restore(handle)
    try:
        state = await client.state(timeout=timeout)
        if journal.unknown_steps:
            # Steps cut by a deadline before the detach, still unknown after the resume
            # (applied, their answers lost): the server's count says how many it applied,
            # in order.
            count = (state.get("step_count") if isinstance(state, Mapping)
                     else getattr(state, "step_count", None))
            if is_int(count):
                journal.settle_applied(count)
    except SessionLostError as exc:
        await client.close()
        raise _gone(handle, exc) from exc
    except BaseException:
        await client.close()
        raise


def _gone(handle: SessionHandle, exc: SessionLostError) -> SessionLostError:
    # The server was reached and no longer has the session: gone. (A server that
    # cannot be reached at all leaves the SessionLostError as it is: it may be back.)
    if isinstance(exc, SessionGoneError) or isinstance(
            exc.__cause__, (ConnectError, ConnectionLostError)):
        return exc
    return SessionGoneError(
        f"cannot attach to session {handle.session_id} on {handle.base_url}: the server no "
        f"longer has it (restarted, or past its resume grace window); the episode had "
        f"{handle.journal.step_count} steps", reason="session_unknown",
        journal=exc.journal or handle.journal.snapshot())


async def detach(client: EnvClient[Any, Any, Any], driver: SessionDriver,
                 seconds: float | None) -> SessionHandle:
    """End ``client``'s connection without ending its server session; the handle to it.

    Runs in the turn of ``driver`` (the client's); the caller closes the client
    afterwards.

    Raises:
        EnvlinkError: no episode in progress, or the session cannot be resumed.
    """
    core = driver.core

    async def run(call: Call) -> SessionHandle:
        lock = take_turn(driver, call) or await wait_turn(driver, call)
        try:
            if core.episode is not Episode.ACTIVE:
                raise EnvlinkError("detach() needs an episode in progress: reset first")
            token, detached = core.resume_token, core.detached_id
            if token is None and detached is None:
                raise EnvlinkError(
                    "this session cannot be detached: the server offers no way to resume "
                    "it (envlink's extension, or OpenEnv detached sessions with "
                    "on_session_lost='resume')")
            base_url = client.base_url
            if base_url is None or client.provider is not None:
                # The provider stops its server when this client closes.
                raise EnvlinkError("a session on a server started by this client's "
                                   "provider cannot be detached")
            handle = SessionHandle(
                base_url=base_url, session_id=core.session_id,
                mechanism=(RecoveryMechanism.ENVLINK_RESUME if token is not None
                           else RecoveryMechanism.OPENENV_RESUME).value,
                journal=core.journal.snapshot(), detached_id=detached,
                resume_token=token)
            await driver.hand_off(seconds)
            return handle
        finally:
            end_turn(driver, lock)

    return await driver.call("detach", seconds, run)


def attach(cls: type[_C], handle: SessionHandle, options: dict[str, Any]) -> Any:
    """A client of class ``cls`` on the handle's session, re-attached now.

    Dispatched as the client's methods are: in plain code it blocks and returns the
    client (in blocking use, on the default bridge); in async code it is awaited.

    Raises:
        SessionGoneError: the server no longer has the session (with the journal).
        TypeError: ``handle`` is not a :class:`SessionHandle`.
    """
    client = _client_for(cls, handle, options)
    return dispatch_call(client, _attached, "attach", (handle,), {})


async def _attached(client: _C, handle: SessionHandle,
                    timeout: float | UnsetType | None = UNSET) -> _C:
    await _resume(client, handle, timeout)
    return client
