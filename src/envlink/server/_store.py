"""Server-side sessions and their on-disk store (for resumption across a restart).

A session owns one environment. Plain sessions die with their socket; extension
sessions have an unguessable token, remember the last request id and its answer
(de-duplication), and may be detached for a grace window and re-attached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlink.server._environments.environment import Environment, supports_snapshot

if TYPE_CHECKING:
    import asyncio

__all__ = ["Session", "SessionInfo", "SessionStore", "new_session_id", "new_token"]

_log = logging.getLogger("envlink.server")
_STORE_VERSION = 1


def new_token() -> str:
    """A random, unguessable session token (192 bits)."""
    return secrets.token_urlsafe(24)


def new_session_id() -> str:
    """A public session id for telemetry; unlike the token it grants nothing."""
    return secrets.token_hex(8)


@dataclass(eq=False)
class Session:
    """One server-side session (internal; tests see :class:`SessionInfo`)."""

    id: str
    env: Environment
    extensions: bool
    token: str | None = None
    step_count: int = 0
    last_request_id: str | None = None
    last_answer: str | None = None
    #: The connection attached to the session, if any (a ``ServerConnection``).
    connection: object | None = None
    #: Wall-clock time (``time.time()``) at which a detached session expires.
    expires_at: float | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    closed: bool = False
    #: Created with ``POST /mcp`` ``openenv/session/create`` (OpenEnv 0.10): kept
    #: across sockets until ``openenv/session/close``.
    detached: bool = False
    #: ``openenv/session/close`` arrived while a socket was attached: destroyed when
    #: that socket goes.
    pending_close: bool = False

    def info(self, now: float) -> SessionInfo:
        """A read-only view."""
        return SessionInfo(
            id=self.id,
            extensions=self.extensions,
            step_count=self.step_count,
            attached=self.connection is not None,
            expires_in=None if self.expires_at is None else max(0.0, self.expires_at - now),
            last_request_id=self.last_request_id,
        )


@dataclass(frozen=True)
class SessionInfo:
    """A read-only view of a server-side session.

    Attributes:
        id: public session id (the ``envlink.session.id`` span attribute).
        extensions: whether the session uses the envlink extensions.
        step_count: steps applied in this session (all episodes).
        attached: whether a connection is attached (else it is detached, awaiting resume).
        expires_in: seconds until a detached session expires, else ``None``.
        last_request_id: the request id whose answer is cached for de-duplication.
    """

    id: str
    extensions: bool
    step_count: int
    attached: bool
    expires_in: float | None
    last_request_id: str | None


class SessionStore:
    """Extension sessions persisted as one JSON file each in a directory.

    Written after every applied request (atomically: temporary file + rename), so a
    server killed with SIGKILL and restarted on the same directory can resume them.
    Sessions whose environment has no ``snapshot``/``restore`` are not persisted.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, token: str) -> Path:
        return self.directory / (hashlib.sha256(token.encode()).hexdigest()[:32] + ".json")

    def save(self, session: Session) -> None:
        """Persist ``session`` (no-op for sessions that cannot be persisted)."""
        if session.token is None or not supports_snapshot(session.env):
            return
        record = {
            "version": _STORE_VERSION,
            "id": session.id,
            "token": session.token,
            "step_count": session.step_count,
            "last_request_id": session.last_request_id,
            "last_answer": session.last_answer,
            "expires_at": session.expires_at,
            "env": session.env.snapshot(),  # type: ignore[attr-defined]
        }
        path = self._path(session.token)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(record, fh, separators=(",", ":"))
            os.replace(tmp, path)
        except OSError:
            _log.warning("envlink.server.store_write_failed", exc_info=True)
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)

    def delete(self, session: Session) -> None:
        """Forget ``session``."""
        if session.token is not None:
            with contextlib.suppress(OSError):
                self._path(session.token).unlink()

    def load(self) -> list[dict[str, Any]]:
        """Every readable record in the directory (unreadable files are skipped)."""
        records = []
        for path in sorted(self.directory.glob("*.json")):
            if path.name.startswith(".tmp-"):
                # Left by a crash in the middle of save(): never a live record.
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                _log.warning("envlink.server.store_record_unreadable path=%s", path)
                continue
            if isinstance(record, dict) and record.get("version") == _STORE_VERSION:
                records.append(record)
        return records

    def delete_record(self, record: dict[str, Any]) -> None:
        """Remove a loaded record's file."""
        token = record.get("token")
        if isinstance(token, str):
            with contextlib.suppress(OSError):
                self._path(token).unlink()
