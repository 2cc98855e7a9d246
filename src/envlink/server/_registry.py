"""The server's sessions: create, attach, detach for a grace window, expire, persist.

A plain session dies with its connection. An extension session is detached when
its connection goes and kept for ``resume_grace`` seconds, re-attachable by its
token; with a :class:`~envlink.server._store.SessionStore` it is written to disk
after every change, so that a restarted server resumes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from envlink.server._counters import AwaitableCounters
from envlink.server._environments.environment import EnvironmentFactory
from envlink.server._store import Session, SessionInfo, SessionStore, new_session_id

__all__ = ["SessionRegistry"]

_log = logging.getLogger("envlink.server")


class SessionRegistry:
    """Every live session of one server, by public id and by token.

    Used from the server's event loop only (grace timers run on it).

    Args:
        factory: builds one environment per session.
        resume_grace: seconds a detached extension session is kept.
        store: where extension sessions are persisted, or ``None``.
        counters: the server's counters (``session.*``).
        detached_idle: seconds an OpenEnv detached session is kept while no socket is
            attached to it (``None``: until closed).
    """

    def __init__(self, factory: EnvironmentFactory, *, resume_grace: float,
                 store: SessionStore | None, counters: AwaitableCounters,
                 detached_idle: float | None = None) -> None:
        self.factory = factory
        self.resume_grace = resume_grace
        self.detached_idle = detached_idle
        self._store = store
        self._counters = counters
        self._sessions: dict[str, Session] = {}
        self._by_token: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session:
        """The live session with this public id (``KeyError`` if none)."""
        return self._sessions[session_id]

    def find(self, session_id: str) -> Session | None:
        """The live session with this public id, if any."""
        return self._sessions.get(session_id)

    def by_token(self, token: str) -> Session | None:
        """The live session with this token, if any."""
        return self._by_token.get(token)

    def infos(self) -> list[SessionInfo]:
        """Read-only views of every live session."""
        now = time.time()
        return [s.info(now) for s in self._sessions.values()]

    def step_counts(self) -> dict[str, int]:
        """Steps applied per live session, by public id."""
        return {s.id: s.step_count for s in self._sessions.values()}

    def create(self, *, session_id: str | None, token: str | None, extensions: bool,
               connection: object) -> Session:
        """A new session attached to ``connection`` (the factory's errors propagate)."""
        env = self.factory()
        session = Session(id=session_id or new_session_id(), env=env, extensions=extensions,
                          token=token, connection=connection)
        self._sessions[session.id] = session
        if session.token is not None:
            self._by_token[session.token] = session
        self._counters.incr("session.created")
        self.persist(session)
        return session

    def create_detached(self) -> Session:
        """An OpenEnv detached session (``openenv/session/create``), attached to nothing."""
        session = Session(id=str(uuid.uuid4()), env=self.factory(), extensions=False,
                          detached=True)
        self._sessions[session.id] = session
        self._counters.incr("session.created")
        self._arm_idle(session)
        return session

    def _arm_idle(self, session: Session) -> None:
        # Anyone can create a detached session with one unauthenticated POST: one that
        # nobody attaches to must not hold a place under max_sessions for good.
        if self.detached_idle is None:
            return
        session.expires_at = time.time() + self.detached_idle
        session.timer = asyncio.get_running_loop().call_later(
            self.detached_idle, self._expire, session)

    def attach(self, session_id: str, connection: object) -> tuple[Session | None, str | None]:
        """Attach a socket to a detached session, or the message OpenEnv refuses it with."""
        session = self._sessions.get(session_id)
        if session is None or not session.detached or session.closed:
            return None, f"Unknown session_id: {session_id}"
        if session.connection is not None:
            return None, f"Session {session_id} already has an attached WebSocket"
        if session.timer is not None:
            session.timer.cancel()
            session.timer = None
        session.expires_at = None
        session.connection = connection
        self._counters.incr("session.attached")
        return session, None

    def close_detached(self, session_id: str) -> bool | None:
        """``openenv/session/close``: ``True`` closed now, ``False`` closed when its socket
        goes, ``None`` unknown session."""
        session = self._sessions.get(session_id)
        if session is None or not session.detached:
            return None
        if session.connection is not None:
            session.pending_close = True
            return False
        self.destroy(session)
        return True

    def claim(self, session: Session, connection: object) -> object | None:
        """Attach ``session`` to ``connection``; return the connection it had, if any."""
        if session.timer is not None:
            session.timer.cancel()
            session.timer = None
        session.expires_at = None
        previous = session.connection
        session.connection = connection
        # Attached again: no deadline on disk until it is detached (or the process
        # dies, when the next start gives it one window).
        self.persist(session)
        return previous

    def release(self, connection: object, session: Session, *, destroy: bool) -> None:
        """``connection`` is done with ``session``: destroy it, or detach it for resumption."""
        if session.connection is not connection:
            return  # taken over by a resumed connection
        session.connection = None
        if session.detached:
            # An OpenEnv detached session outlives its sockets ("close" included)
            # until openenv/session/close.
            if session.pending_close:
                self.destroy(session)
            else:
                self._counters.incr("session.detached")
                self._arm_idle(session)
            return
        if destroy or not session.extensions:
            self.destroy(session)
        else:
            self._detach(session)

    def _detach(self, session: Session) -> None:
        session.expires_at = time.time() + self.resume_grace
        loop = asyncio.get_running_loop()
        session.timer = loop.call_later(self.resume_grace, self._expire, session)
        self._counters.incr("session.detached")
        self.persist(session)

    def _expire(self, session: Session) -> None:
        session.timer = None
        if session.connection is None and not session.closed:
            self.destroy(session)
            self._counters.incr("session.expired")

    def destroy(self, session: Session) -> None:
        """End ``session`` for good: forget it, delete it from the store, close its env."""
        if session.closed:
            return
        session.closed = True
        if session.timer is not None:
            session.timer.cancel()
            session.timer = None
        # Only this exact session's entries: a duplicate must never evict the live one.
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
        if session.token is not None and self._by_token.get(session.token) is session:
            del self._by_token[session.token]
        if self._store is not None:
            self._store.delete(session)
        _close_env(session)
        self._counters.incr("session.destroyed")

    def persist(self, session: Session) -> None:
        """Write ``session`` to the store (extension sessions only)."""
        if self._store is not None and session.extensions and not session.closed:
            self._store.save(session)

    def drop_all(self) -> None:
        """Forget every session (server stop); persisted ones stay on disk."""
        for session in list(self._sessions.values()):
            if session.timer is not None:
                session.timer.cancel()
                session.timer = None
            _close_env(session)
        self._sessions.clear()
        self._by_token.clear()

    def load(self) -> None:
        """Load the persisted sessions (expired ones are deleted), each detached."""
        store = self._store
        if store is None:
            return
        now = time.time()
        loop = asyncio.get_running_loop()
        for record in store.load():
            expires_at = record.get("expires_at")
            if isinstance(expires_at, (int, float)) and expires_at <= now:
                store.delete_record(record)
                continue
            try:
                env = self.factory()
                env.restore(record["env"])  # type: ignore[attr-defined]
                session = Session(
                    id=str(record["id"]), env=env, extensions=True, token=str(record["token"]),
                    step_count=int(record["step_count"]),
                    last_request_id=record.get("last_request_id"),
                    last_answer=record.get("last_answer"),
                )
            except Exception:
                _log.warning("envlink.server.store_record_invalid", exc_info=True)
                store.delete_record(record)
                continue
            # A session that was attached when the process died gets one grace window,
            # and its deadline is persisted at once: a crash loop must not hand an
            # abandoned session a fresh window on every restart.
            fresh = not isinstance(expires_at, (int, float))
            if isinstance(expires_at, (int, float)):
                session.expires_at = float(expires_at)
            else:
                session.expires_at = now + self.resume_grace
            session.timer = loop.call_later(session.expires_at - now, self._expire, session)
            assert session.token is not None
            self._sessions[session.id] = session
            self._by_token[session.token] = session
            if fresh:
                store.save(session)
            self._counters.incr("session.loaded")


def _close_env(session: Session) -> None:
    with contextlib.suppress(Exception):
        close = getattr(session.env, "close", None)
        if callable(close):
            close()
