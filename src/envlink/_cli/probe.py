"""``envlink probe URL``: look at an environment server without writing code.

One session is opened with envlink's own client (``on_session_lost="auto"``) and
its discovery calls (``GET /health``, ``/metadata``, ``/schema``), and closed at the
end (an OpenEnv detached session it created is ended with it); no other session is
touched. The latency sample is ``state`` round trips, which step nothing; the tools
are listed with an ``mcp`` ``tools/list`` message, which OpenEnv answers outside
``step()``, or, on a server without that message (envlink's reference server), with
the environment's ``list_tools`` action on the probe's own session, after the sample.

Exit status, for scripts, CI and readiness probes: ``0`` the server is healthy and
a session opened and answered; ``1`` unreachable, unhealthy, not an environment
server, or a refused session (TLS, authentication, capacity); ``2`` a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

from envlink._client.client import GenericEnvClient
from envlink._config import (
    ConnectionOptions,
    Timeout,
    non_negative_float,
    positive_float,
    positive_int,
)
from envlink._errors import (
    CapacityReachedError,
    ConnectError,
    EnvlinkError,
    HandshakeRejectedError,
    HttpStatusError,
    McpError,
    NotReadyError,
    ProtocolError,
    ServerError,
)
from envlink._launch import discovery
from envlink._launch.lifecycle import Target
from envlink._sansio.policies import ReconnectPolicy
from envlink._transports.base import parse_endpoint
from envlink._transports.choice import transport_label

__all__ = ["DESCRIPTION", "EPILOG", "EXIT_HEALTHY", "EXIT_UNHEALTHY", "EXIT_USAGE",
           "add_arguments", "probe", "probe_from_args"]

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2

DESCRIPTION = ("Look at an environment server (envlink's or OpenEnv's, or a Hugging Face "
               "Space by name): health, protocol and mode, which recovery "
               "on_session_lost='auto' would use, capacity, schema, tools and the round-trip "
               "latency of one session of its own, closed at the end.")
EPILOG = ("exit status: 0 healthy (a session opened and answered), 1 unreachable, unhealthy, "
          "not an environment server or a refused session, 2 usage error. "
          "Example readiness probe: envlink probe http://127.0.0.1:8000 --wait 30 -n 3")

_T = TypeVar("_T")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of ``envlink probe`` to ``p``."""
    p.add_argument("url", metavar="URL",
                   help="the server: http(s):// or ws(s):// URL, or a Space's name "
                        "(owner/space; its token from HF_TOKEN or the token file)")
    p.add_argument("--wait", type=non_negative_float, default=None, metavar="SECONDS",
                   help="poll GET /health until the server is ready, at most SECONDS "
                        "(default: ask once)")
    p.add_argument("-n", "--samples", type=positive_int, default=20, metavar="N",
                   help="state round trips timed for the latency figures (default: "
                        "%(default)s)")
    p.add_argument("--timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help="deadline of each request and of the connect (default: %(default)s)")
    p.add_argument("-H", "--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="an extra request header, e.g. 'Authorization: Bearer TOKEN' "
                        "(repeatable; never printed)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the table")


@dataclass
class Report:
    """What the probe found: one line per check, and the exit status."""

    target: str
    url: str = ""
    lines: list[tuple[str, str]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_UNHEALTHY if self.problems else EXIT_HEALTHY

    def add(self, label: str, text: str, key: str | None = None, value: Any = None) -> None:
        self.lines.append((label, text))
        if key is not None:
            self.data[key] = value

    def fail(self, label: str, text: str, key: str, value: Any = None) -> None:
        self.add(label, text, key, value)
        self.problems.append(f"{label}: {text}")

    def as_json(self) -> dict[str, Any]:
        return {"target": self.target, "url": self.url,
                "healthy": self.exit_code == EXIT_HEALTHY, "exit_code": self.exit_code,
                **self.data, "problems": self.problems}

    def render(self, out: TextIO) -> None:
        out.write(f"envlink probe {self.target}\n")
        if self.url and self.url != self.target:
            out.write(f"  {'url':<10} {self.url}\n")
        for label, text in self.lines:
            out.write(f"  {label:<10} {text}\n")
        failed = ", ".join(dict.fromkeys(p.split(":", 1)[0] for p in self.problems))
        verdict = "healthy" if self.exit_code == EXIT_HEALTHY else f"NOT healthy, see {failed}"
        out.write(f"result: {verdict} (exit {self.exit_code})\n")


def probe_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``envlink probe`` with parsed arguments; print the report; return the status."""
    try:
        headers = _headers(args.header)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        report = asyncio.run(probe(args.url, wait=args.wait, samples=args.samples,
                                   timeout=args.timeout, headers=headers))
    except _UsageError as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        sys.stderr.write("envlink probe: interrupted\n")
        return 130
    if args.json:
        sys.stdout.write(json.dumps(report.as_json(), indent=2) + "\n")
    else:
        report.render(sys.stdout)
    return report.exit_code


class _UsageError(Exception):
    """The target is not something a client can connect to (a usage error)."""


async def probe(target: str, *, wait: float | None = None, samples: int = 20,
                timeout: float = 10.0, headers: Mapping[str, str] | None = None) -> Report:
    """Probe ``target`` and return the report (nothing printed).

    Args:
        target: a server URL or a Space's name.
        wait: seconds to wait for ``GET /health`` to say healthy (``None``: ask once).
        samples: ``state`` round trips timed.
        timeout: deadline of each request and of the connect.
        headers: extra request headers (``Authorization``...).
    """
    report = Report(target)
    try:
        client = GenericEnvClient(
            target, headers=dict(headers or {}), timeout=Timeout(timeout),
            # One connection attempt; a Space is given --wait (else --timeout) to wake up.
            reconnect=ReconnectPolicy(max_attempts=1, max_elapsed=wait or timeout),
            on_session_lost="auto", hooks=[])
    except (ValueError, TypeError) as exc:
        raise _UsageError(f"cannot probe {target!r}: {exc}") from exc
    report.url = client.base_url or target
    try:
        healthy = await _health(client, report, wait)
        if not report.data["health"].get("reachable"):
            return report  # nothing answers there: nothing more to ask
        if report.data["health"].get("status") == 404:
            # No /health: first find out whether there is a /ws at all.
            opened = await _session(client, report)
            session = report.data["session"]
            if not opened and session.get("status") is None and (
                    await _get_status(target, headers, timeout, "/ws") == 404):
                # Not even a WebSocket handshake's answer: a plain GET says 404.
                session["status"] = 404
                index = [label for label, _ in report.lines].index("session")
                text = _status_meaning(404, "GET /ws")
                report.lines[index] = ("session", f"cannot open one: {text}")
                report.problems[-1] = f"session: cannot open one: {text}"
            if _missing(report):
                return report  # neither endpoint: not an environment server
            await _describe(client, report, target, headers, timeout, healthy=healthy)
        else:
            await _describe(client, report, target, headers, timeout, healthy=healthy)
            opened = await _session(client, report)
        if opened:
            await _latency(client, report, samples)
            await _tools(client, report)
    finally:
        await client.close()
    return report


def _missing(report: Report) -> bool:
    """Name the endpoints the server lacks (HTTP 404), first; ``True`` if it has neither
    ``/health`` nor ``/ws`` (nothing more to ask)."""
    missing = [path for path, key in (("/health", "health"), ("/ws", "session"))
               if isinstance(report.data.get(key), dict)
               and report.data[key].get("status") == 404]
    if not missing:
        return False
    what = ("not an OpenEnv environment server at this URL" if len(missing) == 2 else
            "an OpenEnv environment server has both")
    text = f"{' and '.join(missing)} (HTTP 404): {what}"
    report.lines.insert(0, ("missing", text))
    report.data["missing"] = missing
    report.problems.insert(0, f"missing: {text}")
    return len(missing) == 2


async def _health(client: GenericEnvClient, report: Report, wait: float | None) -> bool:
    waited: float | None = None
    try:
        if wait is not None:
            # The wait, then one request timed on its own: the latency shown is the
            # request's, not the time the server took to become ready.
            began = time.perf_counter()
            await client.wait_until_ready(wait)
            waited = time.perf_counter() - began
        started = time.perf_counter()
        health = await client.health()
    except NotReadyError as exc:
        report.fail("health", f"not ready: {exc}", "health",
                    {"reachable": exc.last_status is not None, "status": exc.last_status})
        return False
    except HttpStatusError as exc:
        what = _status_meaning(exc.status, "GET /health")
        report.fail("health", what, "health", {"reachable": True, "status": exc.status})
        return False
    except ProtocolError as exc:
        report.fail("health", f"GET /health answered, but not OpenEnv's health JSON ({exc})",
                    "health", {"reachable": True, "status": 200})
        return False
    except EnvlinkError as exc:
        report.fail("health", f"unreachable: {_explain(exc)}", "health",
                    {"reachable": False, "error": str(exc)})
        return False
    ms = (time.perf_counter() - started) * 1000
    extra = health.model_extra or {}
    ready = "" if waited is None else f"; ready after {waited:.2f} s of --wait"
    report.add("health", f"{health.status} (GET /health, {ms:.1f} ms{ready})", "health",
               {"reachable": True, "status": 200, "healthy": health.healthy,
                "server_status": health.status, "ms": round(ms, 2),
                "waited_s": None if waited is None else round(waited, 3)})
    if not health.healthy:
        report.problems.append(f"health: the server says {health.status!r}")
    sessions, limit = extra.get("sessions"), extra.get("max_sessions")
    if isinstance(sessions, int) and isinstance(limit, int):
        report.add("capacity", f"{sessions} of {limit} sessions in use", "capacity",
                   {"sessions": sessions, "max_sessions": limit})
    else:
        report.add("capacity", "not reported (an OpenEnv server tells its limit only when "
                               "full, in CAPACITY_REACHED)", "capacity", None)
    return health.healthy


async def _describe(client: GenericEnvClient, report: Report, target: str,
                    headers: Mapping[str, str] | None, timeout: float, *,
                    healthy: bool) -> None:
    metadata = await _optional(client.metadata())
    if isinstance(metadata, EnvlinkError):
        report.add("server", f"no metadata ({_short(metadata)})", "metadata", None)
    else:
        version = f" {metadata.version}" if metadata.version else ""
        report.add("server", _clip(f"{metadata.name}{version}: {metadata.description}"),
                   "metadata", metadata.model_dump(exclude={"readme_content"}))
    schema = await _optional(client.schema())
    if isinstance(schema, EnvlinkError):
        report.add("schema", f"not offered ({_short(schema)})", "schema", None)
    else:
        parts = {name: _fields(getattr(schema, name))
                 for name in ("action", "observation", "state")}
        report.data["actions"] = _action_types(schema.action)
        report.add("schema", _clip("; ".join(f"{k}: {', '.join(v) or '-'}"
                                             for k, v in parts.items())), "schema", parts)
    if not healthy:
        return  # a 404 below would say "production" of a server that is not one
    # OpenEnv's simulation mode serves POST /reset (GET: 405); production mode has no
    # HTTP simulation routes (404). Nothing is reset: the GET is refused by routing.
    status = await _get_status(target, headers, timeout, "/reset")
    mode = {405: "simulation", 404: "production"}.get(status or 0)
    text = {"simulation": "simulation (HTTP /reset, /step, /state offered)",
            "production": "production (no HTTP simulation routes)"}.get(
        mode or "", "not told (GET /reset answered neither 405 nor 404)")
    report.add("mode", text, "mode", mode)


async def _get_status(target: str, headers: Mapping[str, str] | None, timeout: float,
                      path: str) -> int | None:
    """The HTTP status of ``GET path`` (``200`` if it answered JSON), ``None`` if none
    came."""
    resolved = Target.resolve(target, None, headers, None)
    options = ConnectionOptions(headers=tuple((resolved.headers or {}).items()))
    try:
        await discovery.fetch(parse_endpoint(resolved.base_url), options, path, timeout)
    except HttpStatusError as exc:
        return exc.status
    except EnvlinkError:
        return None
    return 200


async def _session(client: GenericEnvClient, report: Report) -> bool:
    started = time.perf_counter()
    try:
        await client.connect()
    except HandshakeRejectedError as exc:
        report.fail("session", _status_meaning(exc.status, "the WebSocket upgrade"),
                    "session", {"opened": False, "status": exc.status})
        return False
    except CapacityReachedError as exc:
        report.fail("session", f"refused: the server is full ({exc.active_sessions} of "
                               f"{exc.max_sessions} sessions)", "session", {"opened": False})
        return False
    except EnvlinkError as exc:
        report.fail("session", f"cannot open one: {_explain(exc)}", "session",
                    {"opened": False, "error": str(exc)})
        return False
    ms = (time.perf_counter() - started) * 1000
    report.add("session", f"opened in {ms:.1f} ms", "session",
               {"opened": True, "connect_ms": round(ms, 2)})
    transport = transport_label(client.config.transport, parse_endpoint(client.ws_url),
                                client.config.options)
    report.add("transport", transport, "transport", transport)
    if client.extensions_active:
        report.add("protocol", "OpenEnv WebSocket + envlink extensions (request ids, trace "
                               "context, resume by token)", "protocol", "envlink")
    else:
        report.add("protocol", "OpenEnv WebSocket (plain; no envlink extensions)",
                   "protocol", "openenv")
    recovery = client.recovery
    detached = {"envlink-resume": "not needed (envlink's resume is used)",
                "openenv-resume": "offered (openenv/session/create; the probe's one is "
                                  "closed)",
                "replay": "not offered"}.get(recovery, "unknown")
    report.add("detached", f"OpenEnv detached sessions: {detached}", "detached_sessions",
               recovery == "openenv-resume" if recovery != "envlink-resume" else None)
    meaning = {"envlink-resume": "re-attach by token, a lost answer from the server's cache",
               "openenv-resume": "re-attach to the detached session, settled by step_count",
               "replay": "a new session, the journal replayed and checked"}.get(recovery, "")
    report.add("recovery", f"on_session_lost='auto' -> {recovery} ({meaning})", "recovery",
               recovery)
    return True


async def _tools(client: GenericEnvClient, report: Report) -> None:
    tools: Any = await _optional(client.mcp_list_tools())
    how = ""
    if isinstance(tools, ServerError) and not isinstance(tools, McpError) and (
            "list_tools" in report.data.get("actions", ())):
        # No ``mcp`` message (envlink's reference server): the environment's own
        # list_tools action, on the probe's own session (after the latency sample).
        how = " (list_tools action)"
        tools = await _optional(_list_tools_action(client))
    if isinstance(tools, McpError):
        report.add("tools", f"none (tools/list: {_short(tools)})", "tools", [])
    elif isinstance(tools, ServerError):
        code = getattr(tools.code, "value", tools.code)
        report.add("tools", f"not offered (the server refused the mcp message: {code})",
                   "tools", None)
    elif isinstance(tools, EnvlinkError):
        report.add("tools", f"not listed ({_short(tools)})", "tools", None)
    else:
        names = [str(t.get("name")) for t in tools]
        report.add("tools", _clip(f"{len(names)}{how}: {', '.join(names)}"), "tools", names)


async def _list_tools_action(client: GenericEnvClient) -> list[dict[str, Any]]:
    await client.reset()
    result = await client.step({"type": "list_tools"})
    tools = result.observation.get("tools")
    if not isinstance(tools, list):
        raise ProtocolError("the list_tools action answered no list of tools")
    return [t for t in tools if isinstance(t, dict)]


async def _latency(client: GenericEnvClient, report: Report, samples: int) -> None:
    seconds: list[float] = []
    try:
        for _ in range(samples):
            started = time.perf_counter()
            await client.state()
            seconds.append(time.perf_counter() - started)
    except EnvlinkError as exc:
        report.fail("latency", f"state failed after {len(seconds)} round trips: "
                               f"{_explain(exc)}", "latency", None)
        return
    ordered = sorted(seconds)
    p50, p99 = _rank(ordered, 0.50) * 1000, _rank(ordered, 0.99) * 1000
    report.add("latency", f"state x{samples}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
                          f"max {ordered[-1] * 1000:.2f} ms", "latency",
               {"call": "state", "samples": samples, "p50_ms": round(p50, 3),
                "p99_ms": round(p99, 3), "max_ms": round(ordered[-1] * 1000, 3)})


# --------------------------------------------------------------------------- helpers

async def _optional(call: Awaitable[_T]) -> _T | EnvlinkError:
    try:
        return await call
    except EnvlinkError as exc:
        return exc


def _rank(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` of sorted values."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _fields(schema: Mapping[str, Any]) -> list[str]:
    """Top-level field names of a JSON schema; for a union, each alternative's own."""
    properties = schema.get("properties")
    if isinstance(properties, dict):
        return list(properties)
    defs = schema.get("$defs", {})
    names = []
    for alt in schema.get("anyOf") or schema.get("oneOf") or []:
        ref = alt.get("$ref", "") if isinstance(alt, dict) else ""
        resolved = defs.get(ref.rsplit("/", 1)[-1], alt) if ref else alt
        if not isinstance(resolved, dict):
            continue
        own = [f for f in resolved.get("properties", {}) if f not in ("type", "metadata")]
        title = str(resolved.get("title", "?")).lstrip("_")
        names.append(f"{title}({', '.join(own)})" if own else title)
    return [" | ".join(names)] if names else []


def _action_types(schema: Mapping[str, Any]) -> list[str]:
    """The ``type`` constants of an action schema's alternatives (``list_tools``...)."""
    found = []
    for alt in schema.get("$defs", {}).values():
        kind = alt.get("properties", {}).get("type", {}) if isinstance(alt, dict) else {}
        if isinstance(kind, dict) and isinstance(kind.get("const"), str):
            found.append(kind["const"])
    return found


def _status_meaning(status: int, what: str) -> str:
    if status == 401:
        return (f"{what} answered HTTP 401: the server wants credentials "
                "(pass -H 'Authorization: Bearer TOKEN'; for a Space, HF_TOKEN)")
    if status == 403:
        return (f"{what} answered HTTP 403: the credentials (or the Origin) were refused "
                "(check the token, and the server's allowed origins)")
    if status == 404:
        return f"{what} answered HTTP 404: not an OpenEnv environment server at this URL"
    if status in (502, 503, 504):
        return (f"{what} answered HTTP {status}: not ready or overloaded "
                "(a Space still waking? try --wait SECONDS)")
    return f"{what} answered HTTP {status}"


def _explain(exc: BaseException) -> str:
    """One line: what went wrong, in words an operator can act on."""
    text = str(exc)
    lowered = text.lower()
    if "tls verification failed" in lowered or "certificate verify failed" in lowered:
        return (f"TLS: the server's certificate is not trusted ({text}); give the CA "
                "with SSL_CERT_FILE, or use the certificate's host name")
    if "tls" in lowered or "ssl" in lowered:
        return f"TLS handshake failed ({text}); is the server serving https/wss on this port?"
    if isinstance(exc, ConnectError) and not isinstance(exc, HandshakeRejectedError) and (
            "cannot connect" in lowered or "refused" in lowered or "failed" in lowered):
        return f"nothing accepts connections there ({text})"
    if isinstance(exc, HandshakeRejectedError):
        return _status_meaning(exc.status, "the WebSocket upgrade")
    return _short(exc)


def _short(exc: BaseException) -> str:
    if isinstance(exc, HttpStatusError):
        return f"HTTP {exc.status}"
    return f"{type(exc).__name__}: {exc}"


def _clip(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _headers(values: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--header takes 'NAME: VALUE', got {name.strip()[:40]!r}...")
        headers[name.strip()] = rest.strip()
    return headers
