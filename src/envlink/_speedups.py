"""Fast paths that rely on private names of envlink's dependencies, all in one place.

Each fast path here has a plain fallback that uses public API only, and each is
checked once, at import: when the private name is missing (a dependency changed it),
the fallback is used. Setting ``ENVLINK_NO_SPEEDUPS=1`` before envlink is imported
selects every fallback, so a run with it proves the library correct without them
(CI runs the whole suite once that way). What each fast path saves is measured in
docs/performance.md.

Imports of asyncio and OpenTelemetry happen inside the factory functions, which only
the I/O and telemetry layers call, so the sans-I/O core can use the JSON scanner
without loading either.

At the end, the one measured tweak that needs no private name: the allocator warm-up
that makes asyncio's read buffers come from the heap (:func:`warm_read_buffers`).
"""

from __future__ import annotations

import contextvars
import functools
import os
import sys
import types
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = [
    "ENABLED",
    "SWITCH",
    "baggage_key",
    "composite_parts",
    "context_attacher",
    "current_context_getter",
    "json_parser",
    "json_scanner",
    "lock_fast_path",
    "lock_turns",
    "meter_provider_checks",
    "new_record",
    "running_loop_getter",
    "span_context_fields",
    "span_key",
    "task_of_loop_getter",
    "text_sender",
    "tracer_provider_unset_check",
    "warm_read_buffers",
]

#: The environment variable that turns every fast path off.
SWITCH = "ENVLINK_NO_SPEEDUPS"
#: Whether the fast paths are used (read once, when envlink is imported).
ENABLED = os.environ.get(SWITCH, "").strip().lower() not in ("1", "true", "yes", "on")

_T = TypeVar("_T")


def _new_record_plain(cls: type[_T], values: tuple[Any, ...]) -> _T:
    return cls(*values)


#: Builds a NamedTuple from a tuple of its fields. ``tuple.__new__`` is the C
#: constructor under the generated Python ``__new__``, which it skips.
new_record: Callable[[type[_T], tuple[Any, ...]], _T] = (
    tuple.__new__ if ENABLED else _new_record_plain)  # type: ignore[assignment]


def json_scanner() -> Callable[[str, int], tuple[Any, int]] | None:
    """json's C scanner, called directly, or ``None``: use ``json.loads``.

    ``json.loads`` wraps the scanner in three Python frames and two regex matches.
    """
    if not ENABLED:
        return None
    try:
        from json.decoder import JSONDecoder
        from json.scanner import c_make_scanner  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - an interpreter without the C scanner
        return None
    if c_make_scanner is None:  # pragma: no cover
        return None
    scan: Callable[[str, int], tuple[Any, int]] = c_make_scanner(JSONDecoder())
    return scan


def json_parser() -> Callable[..., Any] | None:
    """pydantic-core's JSON parser (``from_json``), or ``None``; call it as
    ``parse(text, cache_strings="keys")``.

    It reads a frame with fewer instructions than the C scanner (docs/performance.md). Where
    it accepts a text, it gives what ``json.loads`` gives (the tests compare them);
    it refuses some that ``json.loads`` accepts (a lone surrogate escape, nesting
    deeper than its limit), which the caller then hands to ``json.loads``.

    ``cache_strings="keys"`` caches the strings of object keys only: by default
    ``from_json`` keeps every short string it reads, values included, in a process-wide
    cache (16,384 entries), which would keep past answers' request ids and short
    observation strings alive for the life of the process. Keys repeat from frame to
    frame; values mostly do not. The keyword is given at each call, not bound once
    (``functools.partial``, a wrapper): a call with it costs what one without does,
    a bound one about 1.5 k instructions more.
    """
    if not ENABLED:
        return None
    try:
        from pydantic_core import from_json
    except ImportError:  # pragma: no cover - a pydantic-core without it
        return None
    try:
        from_json("{}", cache_strings="keys")
    except TypeError:  # pragma: no cover - a pydantic-core older than the option
        return None
    # Older pydantic-cores read integers of any length, where json.loads (and a
    # newer parser) refuse more digits than the interpreter's limit: such a parser
    # would accept what json.loads refuses, so it is not used.
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    if limit:
        try:
            from_json("1" * (limit + 1))
        except ValueError:
            pass
        else:
            return None
    parse: Callable[..., Any] = from_json
    return parse


def running_loop_getter() -> Callable[[], Any]:
    """A function returning the running event loop or ``None`` (never raising).

    asyncio's private ``_get_running_loop`` does that without an exception when no
    loop runs; the fallback catches the public function's ``RuntimeError``.
    """
    import asyncio

    fast = getattr(asyncio, "_get_running_loop", None)
    if ENABLED and callable(fast):
        return fast  # type: ignore[no-any-return]

    def running_loop() -> asyncio.AbstractEventLoop | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None

    return running_loop


def task_of_loop_getter() -> Callable[[Any], Any]:
    """A function from a running loop to its current task (``None`` for ``None``).

    ``asyncio.current_task`` is a Python function on 3.11 (a C one from 3.12): there
    the fast path is the look-up it makes, in asyncio's own table of current tasks.
    """
    import asyncio

    current = asyncio.current_task
    if isinstance(current, types.BuiltinFunctionType):
        return current  # C already (3.12+): one call either way
    table = getattr(asyncio.tasks, "_current_tasks", None)
    if ENABLED and isinstance(table, dict):
        return table.get
    return lambda loop: None if loop is None else current(loop)


def current_context_getter() -> Callable[[], Any]:
    """``opentelemetry.context.get_current``, or the context variable's own ``get``.

    The API's function asks its runtime context object, which asks a
    ``ContextVar``: two Python calls per frame where one C call gives the same.
    """
    from opentelemetry import context

    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if ENABLED and type(runtime).__name__ == "ContextVarsRuntimeContext" and isinstance(
            var, contextvars.ContextVar):
        return var.get
    return context.get_current


def context_attacher() -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """``(attach, detach)``: OpenTelemetry's, or the context variable's ``set``/``reset``.

    The API's functions ask the runtime context object, which asks its
    ``ContextVar`` (and ``detach`` logs a failure instead of raising: a caller of
    the fast path catches it itself): two Python calls each per span.
    """
    from opentelemetry import context

    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if ENABLED and type(runtime).__name__ == "ContextVarsRuntimeContext" and isinstance(
            var, contextvars.ContextVar):
        return var.set, var.reset
    return context.attach, context.detach


def span_context_fields() -> bool:
    """Whether a ``SpanContext`` is the tuple ``(trace_id, span_id, is_remote,
    trace_flags, trace_state, is_valid)``, to be unpacked in one step instead of
    read through four Python properties (checked on a sample)."""
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    if not ENABLED:
        return False
    state = TraceState([("k", "v")])
    sample = SpanContext(3, 5, True, TraceFlags(1), state)
    try:
        fields = tuple(sample)
    except TypeError:  # pragma: no cover - not a tuple any more
        return False
    return fields == (3, 5, True, 1, state, True) and fields[3] is sample.trace_flags \
        and fields[4] is sample.trace_state and not SpanContext(0, 0, False)[5]


def lock_fast_path() -> bool:
    """Whether an ``asyncio.Lock`` nobody holds or waits for may be taken and given back
    by its two fields, as ``acquire()`` and ``release()`` do in that case, without
    their coroutine and calls (the fields are read on a fresh lock, once)."""
    import asyncio

    if not ENABLED:
        return False
    lock = asyncio.Lock()
    return getattr(lock, "_locked", None) is False and hasattr(lock, "_waiters")


def _take_lock_never(lock: Any) -> bool:
    return False


def lock_turns() -> tuple[Callable[[Any], bool], Callable[[Any], None]]:
    """``(take, give)`` for an ``asyncio.Lock``: ``take(lock)`` takes it at once when
    nobody holds it or waits for it and says whether it did; ``give(lock)`` gives it
    back.

    The fast path does what ``acquire()`` and ``release()`` do in that case, by the
    lock's two fields, without their coroutine and calls. The fallback never takes a
    lock this way (the caller awaits ``lock.acquire()``) and gives it back with
    ``lock.release()``.
    """
    import asyncio

    if not lock_fast_path():
        return _take_lock_never, asyncio.Lock.release

    def take(lock: Any) -> bool:
        if lock._locked or lock._waiters:
            return False
        lock._locked = True
        return True

    def give(lock: Any) -> None:
        if lock._locked and not lock._waiters:
            lock._locked = False  # release(), nobody waiting
        else:
            lock.release()

    return take, give


def span_key() -> Any:
    """The context key OpenTelemetry's current span lives under, or ``None`` (use
    ``trace.get_current_span``); a dict look-up instead of three Python calls."""
    from opentelemetry.trace import propagation

    return getattr(propagation, "_SPAN_KEY", None) if ENABLED else None


def baggage_key() -> Any:
    """The context key OpenTelemetry's baggage lives under, or ``None`` (use
    ``baggage.get_all``); a dict look-up instead of three Python calls per frame."""
    from opentelemetry import baggage

    return getattr(baggage, "_BAGGAGE_KEY", None) if ENABLED else None


def composite_parts(textmap: Any) -> list[Any] | None:
    """The propagators inside a ``CompositePropagator``, or ``None`` when unknown.

    The class keeps them in ``_propagators`` without a public accessor; ``None``
    makes the caller treat the propagator as opaque and always ask it to inject.
    """
    if not ENABLED:
        return None
    parts = getattr(textmap, "_propagators", None)
    return list(parts) if isinstance(parts, (list, tuple)) else None


def tracer_provider_unset_check() -> Callable[[], bool]:
    """A function telling whether no global tracer provider is installed yet.

    ``trace.get_tracer_provider()`` reads ``os.environ`` on every call while none is
    set; the fast path reads the API module's global instead. It is not used when the
    provider is chosen by environment variable, which the public function honours.
    """
    from opentelemetry import trace

    def public() -> bool:
        return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)

    if (ENABLED and hasattr(trace, "_TRACER_PROVIDER")
            and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ):
        return lambda: trace._TRACER_PROVIDER is None
    return public


def meter_provider_checks() -> tuple[Callable[[], bool], Callable[[Any], bool]]:
    """``(unset, is_proxy)``: whether no global meter provider is installed yet, and
    whether a provider is the API's stand-in for one to come.

    The metrics API has no public proxy class. Without the fast path, the global is
    never reported unset and no provider counts as a stand-in: metrics then go
    through the API's proxy, which forwards to a provider installed later, so they
    are still recorded, only at the proxy's cost.
    """
    internal: Any = None
    if ENABLED:
        try:
            from opentelemetry.metrics import _internal as internal
        except ImportError:  # pragma: no cover - a different API layout
            internal = None
    proxy = getattr(internal, "_ProxyMeterProvider", None)

    def is_proxy(provider: Any) -> bool:
        return proxy is not None and type(provider) is proxy

    # The global is read directly unless the provider is chosen by environment
    # variable, which only the public function honours.
    if (internal is not None and hasattr(internal, "_METER_PROVIDER")
            and "OTEL_PYTHON_METER_PROVIDER" not in os.environ):
        return (lambda: getattr(internal, "_METER_PROVIDER", None) is None), is_proxy
    return (lambda: False), is_proxy


def text_sender(connection: Any, open_state: Any
                ) -> Callable[[str | bytes], Awaitable[None]] | None:
    """A coroutine function sending one text message (``str``, or its UTF-8 ``bytes``)
    on a websockets asyncio connection, or ``None``: use the connection's ``send``.

    ``send`` writes through ``send_context``, an async context manager (a generator,
    its ``__aenter__``/``__aexit__`` and a ``drain`` coroutine) around the protocol's
    ``send_text``. When that context would do nothing else (the connection open, no
    fragmented message being sent, writing not paused, the transport not closing),
    the fast path makes the same two calls, ``protocol.send_text`` and the
    connection's ``send_data``, and waits in ``drain`` only when the write paused
    writing; in every other case it is ``send`` itself. websockets names the
    fragmented-send future ``send_in_progress`` (17) or ``fragmented_send_waiter``
    (15.0).
    """
    if not ENABLED:
        return None
    protocol: Any = getattr(connection, "protocol", None)
    transport: Any = getattr(connection, "transport", None)
    waiter = next((name for name in ("send_in_progress", "fragmented_send_waiter")
                   if hasattr(connection, name)), None)
    if (waiter is None or not hasattr(connection, "paused")
            or not all(callable(getattr(connection, name, None))
                       for name in ("send", "send_data", "drain"))
            or not callable(getattr(protocol, "send_text", None))
            or not hasattr(protocol, "state")
            or not callable(getattr(transport, "is_closing", None))):
        return None
    # A partial of a module function rather than a closure over bound methods: each
    # connection keeps two objects for it instead of sixteen.
    return functools.partial(_send_one, connection, protocol, transport, open_state, waiter)


async def _send_one(connection: Any, protocol: Any, transport: Any, open_state: Any,
                    waiter: str, text: str | bytes) -> None:
    if (protocol.state is not open_state or getattr(connection, waiter) is not None
            or connection.paused or transport.is_closing()):
        await connection.send(text, text=True)
        return
    protocol.send_text(text.encode() if isinstance(text, str) else text)
    connection.send_data()
    if connection.paused:
        await connection.drain()


# ------------------------------------------------------------------
# Per-process allocator warm-up for asyncio's socket read buffers (client and server).
#
# asyncio's socket transport reads with ``sock.recv(256 KiB)`` for every frame. Above
# glibc's malloc mmap threshold (128 KiB until the process frees a larger block) each
# such buffer is a fresh mmap, shrunk with mremap and unmapped. That is three system
# calls and a page fault per message received; docs/performance.md ("read buffers from
# the heap") has the cost. glibc raises the threshold
# to the size of the first mmapped block a program frees; heavy programs do that by
# accident at import time, a lean process never does. Freeing one block larger than
# the read buffer once makes every later read buffer come from the heap. Harmless where
# the allocator works otherwise; costs one allocation per process.

_READ_BUFFER_WARMUP = 384 * 1024
_warmed = False


def warm_read_buffers() -> None:
    """Allocate and free one block larger than asyncio's read buffer, once per process."""
    global _warmed
    if not _warmed:
        _warmed = True
        block = bytes(_READ_BUFFER_WARMUP)  # allocated, then freed at once
        del block
