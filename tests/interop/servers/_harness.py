"""Run an app built with OpenEnv's server API on 127.0.0.1, for the interop tests.

Runs under the openenv virtualenv's python, never under envlink's. It adds no
behaviour to the OpenEnv app: it binds the socket itself (so ``--port 0`` works
and a restarted server can take the same port again), prints one readiness line
once uvicorn accepts connections, and optionally wraps the app in a pure
observer that appends every WebSocket event (upgrade headers and query, frames
in and out, closes) and every ``POST /mcp`` JSON-RPC exchange to a JSON-lines
file, so a test can prove what the client really put on the wire and that the
server accepted it.

``--session-timeout`` passes OpenEnv's own ``ConcurrencyConfig.session_timeout``
(its idle-session reaper), unchanged. :func:`announce` prints lifecycle lines
(for example an environment being closed by the reaper) that a test waits for.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The line a test waits for; the port follows the last colon.
READY_PREFIX = "openenv serve: listening on http://127.0.0.1:"


def parse_args(description: str,
               configure: Callable[[argparse.ArgumentParser], None] | None = None,
               ) -> argparse.Namespace:
    """Parse the options every interop server takes (plus those ``configure`` adds)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--max-sessions", type=int, default=1,
                        help="OpenEnv's max_concurrent_envs")
    parser.add_argument("--frame-log", default=None,
                        help="append every WebSocket event to this JSON-lines file")
    parser.add_argument("--session-timeout", type=float, default=None,
                        help="OpenEnv's session_timeout: idle seconds before its reaper "
                             "destroys a session (default: never)")
    parser.add_argument("--require-header", default=None, metavar="NAME=VALUE",
                        help="refuse HTTP requests (401) and WebSocket upgrades (close "
                             "1008) without this header, as a private Space does")
    if configure is not None:
        configure(parser)
    return parser.parse_args()


def require_header(app: ASGIApp, spec: str) -> ASGIApp:
    """``app`` behind a check of one request header (``NAME=VALUE``), like a private Space."""
    name, _, value = spec.partition("=")
    wanted = (name.strip().lower().encode(), value.encode())

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or wanted in [tuple(h) for h in scope["headers"]]:
            await app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    return guarded


def concurrency(args: argparse.Namespace) -> dict[str, Any]:
    """``create_app`` keyword arguments for the session limit and the idle reaper."""
    from openenv.core.env_server.types import ConcurrencyConfig

    if args.session_timeout is None:
        return {"max_concurrent_envs": args.max_sessions}
    return {"concurrency_config": ConcurrencyConfig(
        max_concurrent_envs=args.max_sessions, session_timeout=args.session_timeout)}


#: Lifecycle lines start with this; the test side matches on the rest.
EVENT_PREFIX = "openenv serve: event "


def announce(event: str, **fields: Any) -> None:
    """Print one lifecycle line (``openenv serve: event NAME {json}``) on stdout."""
    print(f"{EVENT_PREFIX}{event} {json.dumps(fields, sort_keys=True)}", flush=True)


class FrameRecorder:
    """ASGI middleware that records WebSocket traffic and changes nothing."""

    def __init__(self, app: ASGIApp, path: str) -> None:
        self._app = app
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the server
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def _write(self, record: dict[str, Any]) -> None:
        # One flushed line per event: the server may be SIGKILLed mid-episode.
        with self._lock:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/mcp":
            await self._record_http(scope, receive, send)
            return
        if scope["type"] != "websocket":
            await self._app(scope, receive, send)
            return
        conn = next(self._ids)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        self._write({"conn": conn, "event": "upgrade", "path": scope["path"],
                     "query": scope.get("query_string", b"").decode("latin-1"),
                     "headers": headers})

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "websocket.receive":
                self._write({"conn": conn, "event": "in", "text": message.get("text"),
                             "bytes": message.get("bytes") is not None})
            elif message["type"] == "websocket.disconnect":
                self._write({"conn": conn, "event": "disconnect", "code": message.get("code")})
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "websocket.accept":
                accept_headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                                  for k, v in message.get("headers", [])}
                self._write({"conn": conn, "event": "accept", "headers": accept_headers})
            elif message["type"] == "websocket.send":
                self._write({"conn": conn, "event": "out", "text": message.get("text")})
            elif message["type"] == "websocket.close":
                self._write({"conn": conn, "event": "close", "code": message.get("code")})
            await send(message)

        try:
            await self._app(scope, recording_receive, recording_send)
        finally:
            # The app is done with this connection: every frame it read is logged.
            # A test reading the log right after its client closed waits for this.
            self._write({"conn": conn, "event": "end"})
            announce("ws_end", conn=conn, tag=headers.get("x-interop-test"))

    async def _record_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Record one HTTP exchange on ``/mcp``: method, body in, status and body out."""
        number = next(self._ids)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        body_in = bytearray()
        body_out = bytearray()
        status: list[int] = []
        written = False

        def record() -> None:
            nonlocal written
            if written:
                return
            written = True
            self._write({"conn": number, "event": "http", "method": scope["method"],
                         "path": scope["path"], "headers": headers,
                         "request": body_in.decode("utf-8", "replace"),
                         "status": status[0] if status else None,
                         "response": body_out.decode("utf-8", "replace")})

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body_in.extend(message.get("body", b""))
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif message["type"] == "http.response.body":
                body_out.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    # Recorded before the client can see the answer: a test that got
                    # the answer finds the exchange in the log.
                    record()
            await send(message)

        try:
            await self._app(scope, recording_receive, recording_send)
        finally:
            record()


class _AnnouncingServer(uvicorn.Server):
    """A uvicorn server that prints the readiness line once it accepts connections."""

    def __init__(self, config: uvicorn.Config, port: int) -> None:
        super().__init__(config)
        self._port = port

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            print(f"{READY_PREFIX}{self._port}", flush=True)


def serve(app: ASGIApp, args: argparse.Namespace) -> None:
    """Serve ``app`` on 127.0.0.1 until killed."""
    if args.require_header:
        app = require_header(app, args.require_header)
    if args.frame_log:
        app = FrameRecorder(app, args.frame_log)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A restarted server re-binds the port its predecessor was killed on.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = _AnnouncingServer(config, port)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    sys.exit(0)
