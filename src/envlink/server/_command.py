"""``envlink serve``: run the reference server from the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, cast

from envlink._bridge.loops import run
from envlink._config import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from envlink._sansio.limits import SERVER_MAX_MESSAGE_VALUES
from envlink.server._faults import CORRUPT_KINDS, DROP_MODES, CorruptKind, DropMode, Faults
from envlink.server._server import DEFAULT_MAX_MESSAGE_SIZE, ENVIRONMENTS, EnvServer

__all__ = [
    "DESCRIPTION",
    "LISTENING_PREFIX",
    "add_arguments",
    "build_parser",
    "main",
    "options_from_args",
    "serve_from_args",
]

#: The one line printed on stdout once the server listens: ``PREFIX + url``.
LISTENING_PREFIX = "envlink serve: listening on "


DESCRIPTION = "Run the envlink reference OpenEnv-compatible environment server."


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``envlink serve`` (and ``python -m envlink.server``)."""
    parser = argparse.ArgumentParser(prog="envlink serve", description=DESCRIPTION)
    add_arguments(parser)
    return parser


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of ``envlink serve`` to ``p``."""
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one "
                   "(default: %(default)s)")
    p.add_argument("--env", choices=sorted(ENVIRONMENTS), default="echo",
                   help="environment to serve (default: %(default)s)")
    p.add_argument("--max-sessions", type=positive_int, default=64, metavar="N",
                   help="sessions open at once, detached ones included; one more is "
                        "refused with CAPACITY_REACHED (default: %(default)s)")
    p.add_argument("--max-message-size", type=positive_int, default=DEFAULT_MAX_MESSAGE_SIZE,
                   metavar="BYTES",
                   help="largest message accepted, after inflating; a larger one closes "
                        "the connection with 1009 (default: %(default)s)")
    p.add_argument("--max-message-values", type=positive_int,
                   default=SERVER_MAX_MESSAGE_VALUES, metavar="N",
                   help="most JSON values in one message, counted before parsing: what "
                        "bounds its memory (default: %(default)s)")
    p.add_argument("--compression", choices=["deflate"], default=None,
                   help="offer permessage-deflate (default: off; the inflated size is "
                        "what --max-message-size counts)")
    access = p.add_argument_group("access and limits")
    access.add_argument("--auth-token", metavar="TOKEN", default=None,
                        help="require 'Authorization: Bearer TOKEN' on every route "
                             "but /health; prefer --auth-token-file or "
                             "$ENVLINK_AUTH_TOKEN, which keep it out of the process list")
    access.add_argument("--auth-token-file", metavar="PATH", default=None,
                        help="read the bearer token from PATH (first line)")
    access.add_argument("--allowed-origins", metavar="ORIGINS", default=None,
                        help="comma-separated browser origins allowed to connect, or '*' "
                             "(default: none; requests without Origin are not affected)")
    access.add_argument("--max-connections", type=positive_int, default=None, metavar="N",
                        help="TCP connections open at once; more are dropped on accept")
    access.add_argument("--idle-timeout", type=positive_float, default=None, metavar="S",
                        help="close a connection that sends no request for S seconds")
    access.add_argument("--detached-idle-timeout", type=positive_float, default=600.0,
                        metavar="S", help="end a detached session left without a socket "
                                          "for S seconds (default: %(default)s)")
    access.add_argument("--certfile", metavar="PEM", default=None,
                        help="serve wss:// and https:// with this certificate chain")
    access.add_argument("--keyfile", metavar="PEM", default=None,
                        help="the private key of --certfile (if not in the same file)")
    p.add_argument("--no-extensions", dest="extensions", action="store_false",
                   help="serve the plain OpenEnv protocol only")
    p.add_argument("--resume-grace", type=non_negative_float, default=30.0, metavar="S",
                   help="seconds a detached session stays resumable (default: %(default)s)")
    p.add_argument("--detached-sessions", action="store_true",
                   help="offer OpenEnv 0.10's detached sessions: POST /mcp "
                        "openenv/session/create|close and /ws?session_id= on the same port")
    p.add_argument("--session-store", metavar="DIR", default=None,
                   help="persist extension sessions in DIR so a restart can resume them")
    p.add_argument("--events", action="store_true",
                   help="after the listening line, print one line per server event "
                        "(`envlink serve: event NAME VALUE`), for tests in another process")
    faults = p.add_argument_group("fault injection")
    faults.add_argument("--latency", type=non_negative_float, default=0.0, metavar="S",
                        help="seconds added before every answer")
    faults.add_argument("--drop-after", type=positive_int, metavar="N",
                        help="drop a connection when its Nth request arrives (once; "
                             "the state read that confirms an attach to a detached "
                             "session is not counted, so N is the same in every mode)")
    faults.add_argument("--drop-mode", choices=DROP_MODES, default="before_apply",
                        help="when --drop-after's drop happens: before_apply (the request "
                             "is never applied), after_apply (applied, never answered), "
                             "mid_answer (applied, the answer cut part-way) "
                             "(default: %(default)s)")
    faults.add_argument("--stall-after", type=positive_int, metavar="N",
                        help="stall a connection when its Nth request arrives (once)")
    faults.add_argument("--error-frames", type=non_negative_int, default=0, metavar="N",
                        help="answer the next N requests with error frames")
    faults.add_argument("--error-code", default="EXECUTION_ERROR", metavar="CODE",
                        help="the code of --error-frames' error frames, e.g. "
                             "CAPACITY_REACHED or SESSION_ERROR (default: %(default)s)")
    faults.add_argument("--corrupt-frames", type=non_negative_int, default=0, metavar="N",
                        help="answer the next N requests with corrupt frames")
    faults.add_argument("--corrupt-kind", choices=CORRUPT_KINDS, default="invalid_json",
                        help="what --corrupt-frames sends: not JSON, a JSON array, a bad "
                             "data field, an unknown type, a missing field, a frame over "
                             "16 MiB, or a binary frame (default: %(default)s)")
    faults.add_argument("--refuse", type=non_negative_int, default=0, metavar="N",
                        help="refuse the next N WebSocket upgrades")
    faults.add_argument("--refuse-for", type=non_negative_float, default=None, metavar="S",
                        help="refuse every WebSocket upgrade for S seconds after start")
    faults.add_argument("--refuse-status", type=int, default=503, metavar="STATUS",
                        help="HTTP status of the upgrades that --refuse and --refuse-for "
                             "refuse (default: %(default)s)")
    faults.add_argument("--retry-after", type=non_negative_float, default=None, metavar="S",
                        help="Retry-After seconds sent with refused upgrades")


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``EnvServer`` keyword arguments (including ``faults``) from parsed arguments."""
    faults = Faults(
        latency=args.latency,
        drop_after=args.drop_after,
        drop_mode=cast(DropMode, args.drop_mode),
        stall_after=args.stall_after,
        error_frames=args.error_frames,
        error_code=args.error_code,
        corrupt_frames=args.corrupt_frames,
        corrupt_kind=cast(CorruptKind, args.corrupt_kind),
        refuse=args.refuse,
        refuse_status=args.refuse_status,
        retry_after=args.retry_after,
    )
    if args.refuse_for:
        faults.refuse_for(args.refuse_for)
    options: dict[str, Any] = {
        "env": args.env,
        "host": args.host,
        "port": args.port,
        "max_sessions": args.max_sessions,
        "max_message_size": args.max_message_size,
        "extensions": args.extensions,
        "resume_grace": args.resume_grace,
        "session_store": args.session_store,
        "faults": faults,
    }
    if args.detached_sessions:
        options["detached_sessions"] = True
    if args.max_message_values != SERVER_MAX_MESSAGE_VALUES:
        options["max_message_values"] = args.max_message_values
    if args.compression is not None:
        options["compression"] = args.compression
    token = _auth_token(args)
    if token is not None:
        options["auth_token"] = token
    if args.allowed_origins is not None:
        options["allowed_origins"] = [o.strip() for o in args.allowed_origins.split(",")
                                      if o.strip()]
    if args.max_connections is not None:
        options["max_connections"] = args.max_connections
    if args.idle_timeout is not None:
        options["idle_timeout"] = args.idle_timeout
    if args.detached_idle_timeout != 600.0:
        options["detached_idle_timeout"] = args.detached_idle_timeout
    if args.certfile is not None:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.certfile, args.keyfile)
        options["ssl"] = context
    elif args.keyfile is not None:
        raise SystemExit("envlink serve: --keyfile needs --certfile")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``envlink serve`` until SIGINT or SIGTERM; return the exit status.

    Prints exactly one line on stdout once listening:
    ``envlink serve: listening on ws://HOST:PORT``.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already reported on stderr
        return exc.code if isinstance(exc.code, int) else 2
    return serve_from_args(args)


def serve_from_args(args: argparse.Namespace) -> int:
    """Serve with parsed arguments until SIGINT or SIGTERM; return the exit status."""
    options = options_from_args(args)
    try:
        # uvloop where installed, unless ENVLINK_LOOP=asyncio (envlink._bridge.loops).
        return run(_serve(options, events=args.events))
    except OSError as exc:
        print(f"envlink serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def _announce(name: str, value: int) -> None:
    sys.stdout.write(f"envlink serve: event {name} {value}\n")
    sys.stdout.flush()


async def _serve(options: dict[str, Any], *, events: bool = False) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    server = EnvServer(**options)
    await server.start()
    try:
        sys.stdout.write(f"{LISTENING_PREFIX}{server.url}\n")
        sys.stdout.flush()
        if events:
            server.add_counter_listener(_announce)
        await stop.wait()
    finally:
        await server.stop()
    return 0


def _auth_token(args: argparse.Namespace) -> str | None:
    if args.auth_token is not None and args.auth_token_file is not None:
        raise SystemExit("envlink serve: give --auth-token or --auth-token-file, not both")
    if args.auth_token_file is not None:
        with open(args.auth_token_file, encoding="utf-8") as f:
            token = f.readline().strip()
        if not token:
            raise SystemExit(f"envlink serve: {args.auth_token_file} holds no token")
        return token
    if args.auth_token is not None:
        return str(args.auth_token)
    return os.environ.get("ENVLINK_AUTH_TOKEN") or None
