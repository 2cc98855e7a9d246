"""The fleet's budget on many hosts: a Redis server (``redis://host:port/db``).

Every decision is one Lua script, atomic on the server and timed by the server's
clock (``TIME``), so hosts' clocks need not agree. A slot is a lease: a member of the
scope's holders (a sorted set scored by its expiry), renewed in one call for all of a
process's slots by its worker, every third of the lease; a host that stops renewing
loses its slots when they expire. Queued waiters are leases too: a dead waiter drops
out of the queue when its lease runs out, so it never blocks the others.

Keys, under ``envlink:fleet:``: ``tickets`` (the arrival counter), ``q:<scope>`` (the
queue, by ticket), ``qs`` (the sessions' queue, for the total), ``alive`` (waiters'
expiries), ``wscope`` (a waiter's scope), ``h:<scope>`` (holders, by expiry),
``low`` (lowered limits), ``conf`` (the configured limits, for status), ``scopes``,
``pace:<name>`` (a pace's window).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis
import redis.exceptions

from envlink._config import redact_url
from envlink._errors import FleetStoreError
from envlink._fleet.backend import TOTAL, ScopeStatus, Want
from envlink._fleet.settings import effective_limit, pace_window

__all__ = ["RedisStore"]

_T = TypeVar("_T")
_PREFIX = "envlink:fleet:"

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_LIMIT = """
local function effective(P, scope, limit, now, every)
  local low = redis.call('HGET', P .. 'low', scope)
  if not low then return limit end
  local l, since = string.match(low, '(%d+):(%d+)')
  local grown = tonumber(l) + math.floor((now - tonumber(since)) / every)
  if limit < 0 or grown < limit then return grown end
  return limit
end
"""

_JOIN = _NOW + """
local P, lease = ARGV[1], tonumber(ARGV[2])
local tickets = {}
for i = 3, #ARGV, 4 do
  local tok, scope = ARGV[i], ARGV[i + 1]
  local limit, total = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local ticket = redis.call('INCR', P .. 'tickets')
  redis.call('ZADD', P .. 'q:' .. scope, ticket, tok)
  if total >= 0 then
    redis.call('ZADD', P .. 'qs', ticket, tok)
    redis.call('HSET', P .. 'conf', '@total', total)
    redis.call('SADD', P .. 'scopes', '@total')
  end
  if limit >= 0 then redis.call('HSET', P .. 'conf', scope, limit) end
  redis.call('ZADD', P .. 'alive', now + lease, tok)
  redis.call('HSET', P .. 'wscope', tok, scope)
  redis.call('SADD', P .. 'scopes', scope)
  tickets[#tickets + 1] = ticket
end
return tickets
"""

_GRANT = _NOW + _LIMIT + """
local P, lease, every, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for _, tok in ipairs(redis.call('ZRANGEBYSCORE', P .. 'alive', '-inf', now)) do
  local sc = redis.call('HGET', P .. 'wscope', tok)
  if sc then redis.call('ZREM', P .. 'q:' .. sc, tok) end
  redis.call('ZREM', P .. 'qs', tok)
  redis.call('HDEL', P .. 'wscope', tok)
end
redis.call('ZREMRANGEBYSCORE', P .. 'alive', '-inf', now)
redis.call('ZREMRANGEBYSCORE', P .. 'h:@total', '-inf', now)
local out = {}
for i = 0, n - 1 do
  local tok, scope = ARGV[5 + i * 4], ARGV[6 + i * 4]
  local limit, total = tonumber(ARGV[7 + i * 4]), tonumber(ARGV[8 + i * 4])
  local q, h = P .. 'q:' .. scope, P .. 'h:' .. scope
  redis.call('ZREMRANGEBYSCORE', h, '-inf', now)
  local eff = effective(P, scope, limit, now, every)
  local held = redis.call('ZCARD', h)
  local ok = redis.call('ZRANK', q, tok) == 0 and (eff < 0 or held < eff)
  if ok and total >= 0 then
    ok = redis.call('ZRANK', P .. 'qs', tok) == 0
         and redis.call('ZCARD', P .. 'h:@total') < total
  end
  local granted = 0
  if ok then
    redis.call('ZADD', h, now + lease, tok)
    if total >= 0 then redis.call('ZADD', P .. 'h:@total', now + lease, tok) end
    redis.call('ZREM', q, tok)
    redis.call('ZREM', P .. 'qs', tok)
    redis.call('ZREM', P .. 'alive', tok)
    redis.call('HDEL', P .. 'wscope', tok)
    granted = 1
    held = held + 1
  end
  out[#out + 1] = granted
  out[#out + 1] = held
  out[#out + 1] = eff
end
return out
"""

_RENEW = _NOW + """
local P, lease = ARGV[1], tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  local tok, scope = ARGV[i], ARGV[i + 1]
  redis.call('ZADD', P .. 'h:' .. scope, 'XX', now + lease, tok)
  redis.call('ZADD', P .. 'h:@total', 'XX', now + lease, tok)
  redis.call('ZADD', P .. 'alive', 'XX', now + lease, tok)
end
return 1
"""

_REFUSED = _NOW + _LIMIT + """
local P, scope, configured, every = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local h = P .. 'h:' .. scope
redis.call('ZREMRANGEBYSCORE', h, '-inf', now)
local held = redis.call('ZCARD', h)
local current = effective(P, scope, configured, now, every)
local base = held
if current >= 0 and current < held then base = current end
local new = math.max(1, base - 1)
redis.call('HSET', P .. 'low', scope, new .. ':' .. now)
return new
"""

_PACE = _NOW + """
local key, window, most = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
if redis.call('ZCARD', key) < most then
  local id = redis.call('INCR', key .. ':n')
  redis.call('ZADD', key, now, now .. ':' .. id)
  redis.call('PEXPIRE', key, math.ceil(window) + 1000)
  return 0
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
return math.max(1, tonumber(oldest[2]) + window - now)
"""

_STATUS = _NOW + """
return now
"""


class RedisStore:
    """The budget of every process, on any host, that names the same Redis database.

    Args:
        url: ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``).
        timeout: the longest one operation may take (connecting included).
        every: seconds after which a lowered limit grows by one.
        lease: seconds a slot or a queue place lives without renewal.
    """

    poll = 0.05

    def __init__(self, url: str, timeout: float, every: float, lease: float) -> None:
        self.shown = redact_url(url)
        self.every_ms = int(every * 1000)
        self.lease_ms = int(lease * 1000)
        self.seen: dict[str, tuple[int, int | None]] = {}
        try:
            self._redis = redis.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout,
                retry_on_timeout=False, health_check_interval=0, decode_responses=True)
        except (ValueError, redis.exceptions.RedisError) as exc:
            raise FleetStoreError(f"the fleet store {self.shown} cannot be used: "
                                  f"{type(exc).__name__}", store=self.shown) from None
        self._scripts = {name: self._redis.register_script(text) for name, text in (
            ("join", _JOIN), ("grant", _GRANT), ("renew", _RENEW), ("refused", _REFUSED),
            ("pace", _PACE), ("now", _STATUS))}

    @contextlib.contextmanager
    def _reached(self) -> Iterator[None]:
        try:
            yield
        except redis.exceptions.RedisError as exc:
            # The message names the store without its password; redis's own may not.
            raise FleetStoreError(
                f"the fleet store {self.shown} could not be reached: {type(exc).__name__}",
                store=self.shown) from None

    def _run(self, name: str, args: list[Any]) -> Any:
        with self._reached():
            return self._scripts[name](args=args)

    def _call(self, fn: Callable[[], _T]) -> _T:
        with self._reached():
            return fn()

    def join(self, wants: list[Want]) -> None:
        args: list[Any] = [_PREFIX, self.lease_ms]
        for want in wants:
            args += [want.token, want.scope, -1 if want.limit is None else want.limit,
                     -1 if want.total is None else want.total]
        for want, ticket in zip(wants, self._run("join", args), strict=True):
            want.ticket = int(ticket)

    def grant(self, wants: list[Want]) -> list[bool]:
        args: list[Any] = [_PREFIX, self.lease_ms, self.every_ms, len(wants)]
        for want in wants:
            args += [want.token, want.scope, -1 if want.limit is None else want.limit,
                     -1 if want.total is None else want.total]
        out = self._run("grant", args)
        granted = []
        for i, want in enumerate(wants):
            ok, held, limit = out[3 * i:3 * i + 3]
            self.seen[want.scope] = (int(held), None if int(limit) < 0 else int(limit))
            granted.append(bool(ok))
        return granted

    def leave(self, want: Want) -> None:
        def leave() -> None:
            pipe = self._redis.pipeline()
            pipe.zrem(f"{_PREFIX}q:{want.scope}", want.token)
            pipe.zrem(f"{_PREFIX}qs", want.token)
            pipe.zrem(f"{_PREFIX}alive", want.token)
            pipe.hdel(f"{_PREFIX}wscope", want.token)
            pipe.execute()
        self._call(leave)

    def release(self, wants: list[Want]) -> None:
        def release() -> None:
            pipe = self._redis.pipeline()
            for want in wants:
                pipe.zrem(f"{_PREFIX}h:{want.scope}", want.token)
                pipe.zrem(f"{_PREFIX}h:{TOTAL}", want.token)
            pipe.execute()
        self._call(release)

    def renew(self, wants: list[Want]) -> None:
        args: list[Any] = [_PREFIX, self.lease_ms]
        for want in wants:
            args += [want.token, want.scope]
        self._run("renew", args)

    def refused(self, scope: str, configured: int | None) -> int:
        return int(self._run("refused", [_PREFIX, scope, -1 if configured is None
                                         else configured, self.every_ms]))

    def _limit_at(self, scope: str, configured: int | None, now_ms: int) -> int | None:
        low = self._call(lambda: self._redis.hget(f"{_PREFIX}low", scope))
        if low is None:
            return configured
        lowered, since = (int(x) for x in str(low).split(":"))
        return effective_limit(configured, lowered, since / 1000, now_ms / 1000,
                               self.every_ms / 1000)

    def limit(self, scope: str, configured: int | None) -> int | None:
        return self._limit_at(scope, configured, int(self._run("now", [])))

    def holders(self, scope: str) -> int:
        now = int(self._run("now", []))
        return int(self._call(lambda: self._redis.zcount(f"{_PREFIX}h:{scope}", now, "+inf")))

    def pace(self, name: str, rate: float) -> float:
        window, most = pace_window(rate)
        wait_ms = int(self._run("pace", [f"{_PREFIX}pace:{name}", window * 1000, most]))
        return wait_ms / 1000

    def status(self) -> list[ScopeStatus]:
        now = int(self._run("now", []))
        scopes = sorted(str(s) for s in self._call(
            lambda: self._redis.smembers(f"{_PREFIX}scopes")))
        configured = {str(k): int(v) for k, v in self._call(
            lambda: self._redis.hgetall(f"{_PREFIX}conf")).items()}
        out = []
        for scope in scopes:
            holders = self._call(lambda s=scope: self._redis.zrangebyscore(  # type: ignore[misc]
                f"{_PREFIX}h:{s}", now, "+inf"))
            queued = self._call(lambda s=scope: self._redis.zrange(  # type: ignore[misc]
                f"{_PREFIX}q:{s}", 0, -1))
            alive = 0
            for token in queued:
                score = self._call(lambda t=token: self._redis.zscore(  # type: ignore[misc]
                    f"{_PREFIX}alive", t))
                alive += score is not None and score >= now
            processes = sorted({str(h).rsplit(":", 1)[0] for h in holders})
            out.append(ScopeStatus(scope, len(holders), alive,
                                   self._limit_at(scope, configured.get(scope), now),
                                   processes))
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._redis.close()
