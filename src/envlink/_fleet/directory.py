"""The fleet's budget on one host: files under a directory, held with ``flock``.

Layout under the directory::

    lock                  the store's mutex (flock), held for each operation
    state.json            tickets, lowered limits, the configured limits, paces
    scopes/<h>/name       the scope's name
    scopes/<h>/<i>        slot i of the scope: held while its holder keeps it flocked
    queue/<ticket>-<h>-<kind>-<pid>   a waiter, alive while its process keeps it flocked

A slot is held by an open file description that holds ``flock`` on its file, so the
kernel gives it back the moment its holder dies, by SIGKILL too: no PID is guessed.
A queued waiter's file is flocked the same way, so a dead waiter is skipped and
removed by the next process that looks. Slots are taken only under the mutex, so
counting them there (a non-blocking ``flock`` per file) is exact.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envlink._errors import FleetStoreError
from envlink._fleet.backend import TOTAL, ScopeStatus, Want
from envlink._fleet.settings import effective_limit, lowered_limit, pace_window

__all__ = ["DirectoryStore"]

_LOCK_SPIN = 0.002


def _hash(scope: str) -> str:
    return hashlib.sha1(scope.encode()).hexdigest()[:16]


def _free(fd: int) -> bool:
    """Whether nobody holds the flock of ``fd``'s file (probed without keeping it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


class DirectoryStore:
    """The budget of the processes of one host that name the same directory.

    Args:
        path: the directory (made if missing).
        timeout: the longest wait for the mutex before the store counts as unreachable.
        every: seconds after which a lowered limit grows by one.
    """

    poll = 0.02

    def __init__(self, path: str, timeout: float, every: float) -> None:
        self.root = Path(path)
        self.timeout = timeout
        self.every = every
        try:
            (self.root / "scopes").mkdir(parents=True, exist_ok=True)
            (self.root / "queue").mkdir(exist_ok=True)
            self._mutex = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._error(f"cannot be used: {exc.strerror}") from exc
        _stores.add(self)
        #: Slots this process holds: want token -> fds of its slot files.
        self._held: dict[str, list[int]] = {}
        #: This process's queued wants: token -> the fd of its queue file and its name.
        self._queued: dict[str, tuple[int, str]] = {}
        #: Probing fds of slot and queue files (never holding), kept open.
        self._probes: dict[str, int] = {}
        self.seen: dict[str, tuple[int, int | None]] = {}

    def _error(self, what: str) -> FleetStoreError:
        return FleetStoreError(f"the fleet store {str(self.root)!r} {what}",
                               store=str(self.root))

    # ------------------------------------------------------------------ the mutex

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        expires = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self._mutex, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= expires:
                    raise self._error(f"stayed locked for {self.timeout:g} s") from None
                time.sleep(_LOCK_SPIN)
        try:
            state = self._read()
            before = json.dumps(state, sort_keys=True)
            yield state
            if json.dumps(state, sort_keys=True) != before:
                self._write(state)
        except OSError as exc:
            raise self._error(f"failed: {exc.strerror or exc}") from exc
        finally:
            fcntl.flock(self._mutex, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        try:
            text = (self.root / "state.json").read_text()
        except FileNotFoundError:
            return {}
        try:
            state = json.loads(text)
        except ValueError:
            return {}
        return state if isinstance(state, dict) else {}

    def _write(self, state: dict[str, Any]) -> None:
        tmp = self.root / f"state.json.{os.getpid()}"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.root / "state.json")

    # ------------------------------------------------------------------ slots

    def _scope_dir(self, scope: str) -> Path:
        where = self.root / "scopes" / _hash(scope)
        if not where.is_dir():
            where.mkdir(exist_ok=True)
            (where / "name").write_text(scope)
        return where

    def _probe(self, path: Path) -> int:
        key = str(path)
        fd = self._probes.get(key)
        if fd is None:
            fd = self._probes[key] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        return fd

    def _slots(self, scope: str) -> list[Path]:
        where = self._scope_dir(scope)
        return sorted((p for p in where.iterdir() if p.name.isdigit()),
                      key=lambda p: int(p.name))

    def _count(self, scope: str) -> tuple[int, Path | None]:
        """Slots of ``scope`` held, and a free slot file (or ``None``: make one)."""
        held, free = 0, None
        for path in self._slots(scope):
            if _free(self._probe(path)):
                if free is None:
                    free = path
            else:
                held += 1
        return held, free

    def _take(self, scope: str, free: Path | None) -> int:
        if free is None:
            where = self._scope_dir(scope)
            numbers = [int(p.name) for p in where.iterdir() if p.name.isdigit()]
            free = where / str(max(numbers, default=-1) + 1)
        fd = os.open(free, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.uname().nodename}:{os.getpid()}".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # ------------------------------------------------------------------ the queue

    def join(self, wants: list[Want]) -> None:
        with self._locked() as state:
            for want in wants:
                want.ticket = ticket = int(state.get("tickets", 0)) + 1
                state["tickets"] = ticket
                if want.limit is not None:
                    state.setdefault("configured", {})[want.scope] = want.limit
                if want.total is not None:
                    state.setdefault("configured", {})[TOTAL] = want.total
                kind = "s" if want.total is not None else "x"
                name = f"{ticket:012d}-{_hash(want.scope)}-{kind}-{os.getpid()}"
                fd = os.open(self.root / "queue" / name, os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._queued[want.token] = (fd, name)

    def _unqueue(self, want: Want) -> None:
        entry = self._queued.pop(want.token, None)
        if entry is not None:
            fd, name = entry
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root / "queue" / name)
            os.close(fd)

    def _live_queue(self) -> list[str]:
        """The queue's live entries, oldest first; dead waiters' files removed."""
        mine = {name for _, name in self._queued.values()}
        live = []
        for name in sorted(os.listdir(self.root / "queue")):
            if name in mine:
                live.append(name)
                continue
            path = self.root / "queue" / name
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                alive = not _free(fd)
            finally:
                os.close(fd)
            if alive:
                live.append(name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        return live

    def _alive(self, name: str, mine: set[str], memo: dict[str, bool]) -> bool:
        """Whether the queue entry ``name`` has a live waiter (a dead one's is removed)."""
        if name in mine:
            return True
        known = memo.get(name)
        if known is not None:
            return known
        path = self.root / "queue" / name
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            memo[name] = False
            return False
        try:
            alive = not _free(fd)
        finally:
            os.close(fd)
        if not alive:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        memo[name] = alive
        return alive

    def grant(self, wants: list[Want]) -> list[bool]:
        granted = [False] * len(wants)
        with self._locked() as state:
            # Only the entries ahead of a want are looked at, and each waiter's liveness
            # once: a process whose wants are far back in the queue does little per poll.
            names = sorted(os.listdir(self.root / "queue"))
            mine = {name for _, name in self._queued.values()}
            memo: dict[str, bool] = {}
            taken: set[str] = set()
            #: Scopes (by hash) no later want may get in this pass; "*": the total.
            blocked: set[str] = set()
            now = time.time()
            counts: dict[str, tuple[int, Path | None]] = {}
            for i, want in enumerate(wants):
                entry = self._queued.get(want.token)
                if entry is None:
                    continue
                _, name = entry
                h = _hash(want.scope)
                if h in blocked or (want.total is not None and "*" in blocked):
                    continue
                ahead = False
                for other in names:
                    if other >= name:
                        break
                    if other in taken:
                        continue
                    _, oh, okind, _ = other.split("-", 3)
                    if (oh == h or (want.total is not None and okind == "s")) \
                            and self._alive(other, mine, memo):
                        ahead = True
                        break
                if ahead:
                    blocked.add(h)
                    continue
                limit = self._limit(state, want.scope, want.limit, now)
                held, free = counts.get(want.scope) or self._count(want.scope)
                self.seen[want.scope] = (held, limit)
                if limit is not None and held >= limit:
                    counts[want.scope] = (held, free)
                    blocked.add(h)
                    continue
                total_held, total_free = (0, None)
                if want.total is not None:
                    total_held, total_free = counts.get(TOTAL) or self._count(TOTAL)
                    if total_held >= want.total:
                        counts[TOTAL] = (total_held, total_free)
                        blocked.add("*")
                        continue
                fds = [self._take(want.scope, free)]
                if want.total is not None:
                    fds.append(self._take(TOTAL, total_free))
                    counts.pop(TOTAL, None)
                counts.pop(want.scope, None)
                self.seen[want.scope] = (held + 1, limit)
                self._held[want.token] = fds
                self._unqueue(want)
                taken.add(name)
                granted[i] = True
        return granted

    def leave(self, want: Want) -> None:
        with self._locked():
            self._unqueue(want)

    def release(self, wants: list[Want]) -> None:
        # No mutex needed: letting go of a flock is atomic, and slots are only counted
        # and taken under the mutex.
        for want in wants:
            for fd in self._held.pop(want.token, ()):
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def renew(self, wants: list[Want]) -> None:
        """Nothing to renew: a slot lives as long as its holder's open file."""

    # ------------------------------------------------------------------ limits

    def _limit(self, state: dict[str, Any], scope: str, configured: int | None,
               now: float) -> int | None:
        lowered = state.get("lowered", {}).get(scope)
        if lowered is None:
            return configured
        return effective_limit(configured, int(lowered[0]), float(lowered[1]), now,
                               self.every)

    def refused(self, scope: str, configured: int | None) -> int:
        with self._locked() as state:
            now = time.time()
            current = self._limit(state, scope, configured, now)
            new = lowered_limit(current, self._count(scope)[0])
            state.setdefault("lowered", {})[scope] = [new, now]
            return new

    def limit(self, scope: str, configured: int | None) -> int | None:
        with self._locked() as state:
            return self._limit(state, scope, configured, time.time())

    def holders(self, scope: str) -> int:
        with self._locked():
            return self._count(scope)[0]

    def pace(self, name: str, rate: float) -> float:
        window, most = pace_window(rate)
        with self._locked() as state:
            now = time.time()
            paces = state.setdefault("paces", {})
            recent = [float(t) for t in paces.get(name, []) if float(t) > now - window]
            if len(recent) < most:
                recent.append(now)
                paces[name] = recent
                return 0.0
            paces[name] = recent
            return max(0.001, min(recent) + window - now)

    def status(self) -> list[ScopeStatus]:
        out = []
        with self._locked() as state:
            live = self._live_queue()
            now = time.time()
            configured = state.get("configured", {})
            for where in sorted((self.root / "scopes").iterdir()):
                try:
                    scope = (where / "name").read_text()
                except OSError:
                    continue
                processes = []
                held = 0
                for path in self._slots(scope):
                    if not _free(self._probe(path)):
                        held += 1
                        with contextlib.suppress(OSError):
                            processes.append(path.read_text())
                waiters = sum(1 for name in live if name.split("-")[1] == where.name)
                limit = self._limit(state, scope, configured.get(scope), now)
                out.append(ScopeStatus(scope, held, waiters, limit, sorted(set(processes))))
        return out

    def forget(self) -> None:
        """In a forked child: close the inherited descriptors without unlocking them
        (the slots and queue places are the parent's, which keeps them)."""
        fds = [*self._probes.values(), *(fd for fd, _ in self._queued.values()),
               *(fd for fds in self._held.values() for fd in fds), self._mutex]
        self._probes.clear()
        self._queued.clear()
        self._held.clear()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        for fd in self._probes.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._probes.clear()
        for fd, _ in self._queued.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._queued.clear()
        # The slots still held stay held until released or until the process ends.
        with contextlib.suppress(OSError):
            os.close(self._mutex)


_stores: weakref.WeakSet[DirectoryStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A forked child shares its parent's open files, and with them the flocks: it
    # closes its copies, so that the slots go back when the parent lets go of them.
    for store in list(_stores):
        store.forget()
    _stores.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
