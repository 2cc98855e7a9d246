"""Each private-API fast path agrees with its public fallback; one switch turns them off."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from envlink import _speedups

pytestmark = pytest.mark.timeout(30)

SRC = Path(__file__).resolve().parents[2] / "src" / "envlink"


class Record(NamedTuple):
    a: str
    b: int


def test_records_built_either_way_are_equal() -> None:
    """new_record gives the same NamedTuple as calling the class."""
    fast = tuple.__new__(Record, ("x", 1))
    assert fast == _speedups._new_record_plain(Record, ("x", 1)) == Record("x", 1)
    assert type(fast) is Record and fast.b == 1


@pytest.mark.parametrize("text", ['{"type":"observation","data":{"x":[1,2.5,null,true]}}',
                                  '{"a":"\\u00e9\\n","b":{"c":{}}}', '{"n":-0.0,"e":1e308}'])
def test_the_json_parser_decodes_frames_as_json_loads(text: str) -> None:
    """pydantic-core's parser, when used, reads a frame as json.loads does."""
    parse = _speedups.json_parser()
    if parse is None:
        pytest.skip(f"fast paths are off ({_speedups.SWITCH}), or this pydantic-core "
                    "reads integers longer than json.loads does")
    assert repr(parse(text, cache_strings="keys")) == repr(json.loads(text))


def test_frames_are_read_caching_keys_not_values() -> None:
    """The fast parser keeps the strings of keys in pydantic-core's process-wide cache, not
    those of values (by default from_json caches every short string, values included):
    two reads of one answer share its keys' string objects, never its values'."""
    if _speedups.json_parser() is None:
        pytest.skip(f"fast paths are off ({_speedups.SWITCH}), or this pydantic-core "
                    "reads integers longer than json.loads does")
    from envlink._sansio.protocol import decode_response

    text = ('{"type":"observation","id":"req-41","data":{"observation":'
            '{"echoed_message":"hi there"},"reward":null,"done":false}}')
    first, second = decode_response(text), decode_response(text)
    assert first == second
    one, two = first.raw_data["observation"], second.raw_data["observation"]
    assert one == two == {"echoed_message": "hi there"}
    assert next(iter(one)) is next(iter(two))  # a key: cached
    assert first.id == second.id == "req-41"
    assert first.id is not second.id  # values: not cached
    assert one["echoed_message"] is not two["echoed_message"]


_EDGES = ['{"a":"\\ud800"}', '{"a":"\\udc00\\ud800"}', '{"a":"\\ud83d\\ude00"}', '{"a":1e400}',
          '{"a":-1e400}', '{"a":1e-400}', '{"a":5e-324}', '{"a":NaN,"b":Infinity,"c":-Infinity}',
          '{"a":1,"a":2}', '{"a":-0,"b":-0.0}', '{"a":9007199254740993,"b":9007199254740993.0}',
          '{"a":1.00000000000000011102230246251565404236316680908203125}',
          '{"a":' + "1" * 4300 + '}', '{"a":' + "1" * 4301 + '}',
          '{"a":' + "[" * 300 + "]" * 300 + '}',
          '{"a":"x\ty"}', '{"a":"\x1f"}', '{"a":"\x7f\u00e9"}', ' {"a":1} ', '{"a":.5}',
          '[1]', '"s"']


@pytest.mark.parametrize("text", _EDGES)
def test_the_json_parser_never_differs_from_json_loads(text: str) -> None:
    """Where the parser accepts a text, json.loads accepts it with the same value;
    where json.loads refuses one, so does the parser."""
    parse = _speedups.json_parser()
    if parse is None:
        pytest.skip(f"fast paths are off ({_speedups.SWITCH}), or this pydantic-core "
                    "reads integers longer than json.loads does")
    try:
        expected = repr(json.loads(text))
    except ValueError:
        with pytest.raises(ValueError):  # noqa: PT011 - any refusal will do
            parse(text, cache_strings="keys")
        return
    try:
        got = parse(text, cache_strings="keys")
    except ValueError:
        return  # refused: the caller hands it to json.loads
    assert repr(got) == expected


@pytest.mark.parametrize("text", ['{"type":"observation","data":{"x":[1,2.5,null,true]}}',
                                  '{"a":"\\u00e9\\n","b":{"c":{}}}', '{"n":-0.0,"e":1e308}'])
def test_the_json_scanner_decodes_as_json_loads(text: str) -> None:
    """The C scanner, when present, reads a frame as json.loads does, to its end."""
    scan = _speedups.json_scanner()
    if scan is None:
        pytest.skip(f"fast paths are off ({_speedups.SWITCH}) or the C scanner is missing")
    value, end = scan(text, 0)
    assert value == json.loads(text)
    assert end == len(text)


async def test_the_running_loop_getter_agrees_with_asyncio() -> None:
    """Inside a coroutine both ways return the running loop."""
    assert _speedups.running_loop_getter()() is asyncio.get_running_loop()


def test_the_running_loop_getter_returns_none_outside_a_loop() -> None:
    """Outside any loop the getter returns None rather than raising."""
    assert _speedups.running_loop_getter()() is None


def test_the_baggage_key_finds_what_get_all_finds() -> None:
    """A context with baggage has it under the key; one without has nothing there."""
    key = _speedups.baggage_key()
    with_baggage = baggage.set_baggage("k", "v")
    assert dict(baggage.get_all(with_baggage)) == {"k": "v"}
    if key is not None:
        assert with_baggage.get(key) == {"k": "v"}
        assert not otel_context.Context().get(key)


def test_composite_parts_are_the_propagators_it_was_given() -> None:
    """The parts read from a CompositePropagator are those it injects with."""
    parts = [TraceContextTextMapPropagator(), W3CBaggagePropagator()]
    found = _speedups.composite_parts(CompositePropagator(parts))
    assert found is None or [type(p) for p in found] == [type(p) for p in parts]


def test_the_context_attacher_makes_the_context_current_as_attach_does() -> None:
    """The fast attach makes a context current and its detach restores the one before."""
    attach, detach = _speedups.context_attacher()
    before = otel_context.get_current()
    ctx = otel_context.set_value("envlink-test", 1)
    token = attach(ctx)
    try:
        assert otel_context.get_current() is ctx
    finally:
        detach(token)
    assert otel_context.get_current() is before


@pytest.mark.parametrize("state", [trace.DEFAULT_TRACE_STATE,
                                   trace.TraceState([("vendor", "x")])])
@pytest.mark.parametrize("flags", [0, 1])
def test_span_context_fields_unpack_to_the_properties(flags: int,
                                                      state: trace.TraceState) -> None:
    """Where the fast path unpacks a span context, its fields are what the properties say."""
    span_context = trace.SpanContext(0xABC, 0xDEF, False, trace.TraceFlags(flags), state)
    if not _speedups.ENABLED:
        pytest.skip(f"fast paths are off ({_speedups.SWITCH})")
    # A changed layout is a failure, not a skip: the fast path would be silently off.
    assert _speedups.span_context_fields(), "OpenTelemetry's SpanContext layout changed"
    trace_id, span_id, is_remote, trace_flags, trace_state, valid = span_context
    assert (trace_id, span_id, is_remote, valid) == (0xABC, 0xDEF, False, True)
    assert trace_flags is span_context.trace_flags and trace_state is span_context.trace_state


def test_the_provider_checks_agree_with_the_public_api() -> None:
    """While no global provider is set, fast and public checks both say so."""
    tracer_unset = _speedups.tracer_provider_unset_check()
    public = isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert tracer_unset() is public
    unset, is_proxy = _speedups.meter_provider_checks()
    from opentelemetry import metrics
    provider = metrics.get_meter_provider()
    assert is_proxy(metrics.NoOpMeterProvider()) is False
    if unset():
        assert is_proxy(provider)


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "fallback"])
async def test_lock_turns_take_and_give_a_lock_as_acquire_and_release_do(
        fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """take() takes only a lock nobody holds or waits for (a woken waiter keeps its
    place: FIFO), give() wakes the next waiter; with the fast paths off, lock_turns()
    gives a pair that never takes and that releases."""
    if not fast:
        monkeypatch.setattr(_speedups, "ENABLED", False)
    take, give = _speedups.lock_turns()
    takes = fast and _speedups.ENABLED
    lock = asyncio.Lock()
    assert take(lock) is takes
    if not takes:
        await lock.acquire()
    assert lock.locked() and not take(lock)  # held
    waiter = asyncio.ensure_future(lock.acquire())
    await asyncio.sleep(0)
    give(lock)  # someone waits: release() hands the lock on
    assert not take(lock)  # the woken waiter goes first, even before it runs
    await waiter
    assert lock.locked() and not take(lock)
    give(lock)
    assert not lock.locked()
    assert take(lock) is takes


@contextlib.asynccontextmanager
async def _peer(handler: Any, small_buffers: bool = False,
                compression: str | None = None) -> AsyncIterator[ClientConnection]:
    """A websockets server on loopback running ``handler``, and a client connected
    (uncompressed unless ``compression="deflate"``).

    ``small_buffers``: the kernel's send and receive buffers of the connection are
    as small as it allows, set before it is made.
    """
    listening = socket.socket()
    client = socket.socket()
    if small_buffers:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    listening.bind(("127.0.0.1", 0))
    async with serve(handler, sock=listening, max_size=None,
                     compression=compression) as server:
        port = server.sockets[0].getsockname()[1]
        client.setblocking(False)
        await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
        async with connect(f"ws://127.0.0.1:{port}", sock=client, max_size=None,
                           compression=compression) as ws:
            yield ws


def _fast_sender(ws: ClientConnection) -> Callable[[str], Awaitable[None]]:
    if not _speedups.ENABLED:
        pytest.skip(f"fast paths are off ({_speedups.SWITCH})")
    fast = _speedups.text_sender(ws, State.OPEN)
    assert fast is not None, "the installed websockets lacks a name the fast path reads"
    return fast


def _collector(count: int) -> tuple[list[str], asyncio.Event, Callable[[Any], Awaitable[None]]]:
    """A server handler keeping the messages it receives; the event is set at ``count``."""
    got: list[str] = []
    done = asyncio.Event()

    async def handler(ws: Any) -> None:
        async for message in ws:
            got.append(message)
            if len(got) == count:
                done.set()

    return got, done, handler


@pytest.mark.parametrize("compression", [None, "deflate"])
async def test_the_text_sender_writes_what_send_writes(compression: str | None) -> None:
    """Messages sent by the fast path and by ``send``, interleaved, arrive in order and
    intact; the fast path is in use on the installed websockets."""
    got, done, handler = _collector(4)
    async with _peer(handler, compression=compression) as ws:
        fast = _fast_sender(ws)
        await fast('{"n": 1, "text": "\u00e9\u4e2d"}')
        await ws.send('{"n": 2}')
        await fast("x" * 70_000)  # a 64-bit length
        await fast("")
        await asyncio.wait_for(done.wait(), 10)
    assert got == ['{"n": 1, "text": "\u00e9\u4e2d"}', '{"n": 2}', "x" * 70_000, ""]


async def test_the_text_sender_waits_for_a_fragmented_message_being_sent() -> None:
    """While ``send`` is sending a fragmented message, the fast path does not write in
    the middle of it: its message follows the whole fragmented one."""
    got, done, handler = _collector(2)
    release = asyncio.Event()
    first_sent = asyncio.Event()

    async def fragments() -> AsyncIterator[str]:
        yield "first half, "
        first_sent.set()  # asked for the next fragment: the first one is written
        await release.wait()
        yield "second half"

    async with _peer(handler) as ws:
        fast = _fast_sender(ws)
        fragmented = asyncio.ensure_future(ws.send(fragments()))
        await asyncio.wait_for(first_sent.wait(), 10)
        after = asyncio.ensure_future(fast("after"))
        await asyncio.sleep(0)  # one turn: the task runs until it waits
        assert not after.done()
        release.set()
        await asyncio.wait_for(asyncio.gather(fragmented, after), 10)
        await asyncio.wait_for(done.wait(), 10)
    assert got == ["first half, second half", "after"]


async def test_the_text_sender_waits_while_writing_is_paused() -> None:
    """A message larger than the write buffer's limit, to a peer that does not read:
    the fast path waits in ``drain`` as ``send`` does, and finishes once it reads."""
    reading = asyncio.Event()
    received = asyncio.Event()
    got: list[int] = []

    ready = asyncio.Event()

    async def handler(ws: Any) -> None:
        # The server stops reading; with the kernel's buffers small, what the
        # client writes stays in the client's transport.
        ws.transport.pause_reading()
        ready.set()
        await reading.wait()
        ws.transport.resume_reading()
        got.append(len(await ws.recv()))
        received.set()

    async with _peer(handler, small_buffers=True) as ws:
        try:
            await asyncio.wait_for(ready.wait(), 10)
            fast = _fast_sender(ws)
            big = asyncio.ensure_future(fast("y" * (8 << 20)))
            await asyncio.sleep(0)  # one turn: the task writes, then waits in drain
            assert not big.done()
            assert ws.transport.get_write_buffer_size() > 0
        finally:
            reading.set()  # else the server's handler would wait for ever
        await asyncio.wait_for(big, 20)
        await asyncio.wait_for(received.wait(), 20)
    assert got == [8 << 20]


async def test_the_text_sender_on_a_closed_connection_raises_as_send_does() -> None:
    """After the close, both raise websockets' ConnectionClosed (the transport turns it
    into ConnectionLostError)."""
    async def handler(ws: Any) -> None:
        await ws.wait_closed()

    async with _peer(handler) as ws:
        fast = _fast_sender(ws)
        await ws.close()
        with pytest.raises(ConnectionClosed):
            await ws.send("late")
        with pytest.raises(ConnectionClosed):
            await fast("late")


def test_the_switch_selects_every_fallback() -> None:
    """With ENVLINK_NO_SPEEDUPS=1 every fast path is off, and the library still frames
    and parses a message."""
    code = (
        "from envlink import _speedups as s\n"
        "from envlink._sansio.protocol import decode_response\n"
        "from envlink._client.propagation import trace_carrier\n"
        "assert not s.ENABLED\n"
        "assert s.json_scanner() is None and s.baggage_key() is None\n"
        "assert s.json_parser() is None\n"
        "assert s.new_record is s._new_record_plain\n"
        "import asyncio; assert s.running_loop_getter() is not asyncio._get_running_loop\n"
        "assert s.composite_parts(object()) is None\n"
        "assert s.text_sender(object(), None) is None\n"
        "assert s.lock_turns() == (s._take_lock_never, asyncio.Lock.release)\n"
        "f = decode_response('{\"type\":\"state\",\"data\":{\"step_count\":2}}', max_size=None)\n"
        "assert f.data['step_count'] == 2, f\n"
        "assert trace_carrier() == {}\n")
    env = {**os.environ, _speedups.SWITCH: "1", "PYTHONPATH": str(SRC.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=25, env=env)
    assert done.returncode == 0, done.stderr


#: The dependencies whose private names only envlink._speedups may read.
_DEPENDENCIES = ("asyncio", "websockets", "opentelemetry")
#: Private names that a dependency defines and envlink defines for its own objects
#: as well, read outside ``self``/``cls`` on what is envlink's own object (file,
#: the receiver as written, the name). Any other read of such a name is a
#: dependency's.
_OWN_OBJECTS = {
    ("_client/driver.py", "driver", "_lock"), ("_client/driver.py", "driver", "_loop"),
    ("_client/driver.py", "driver", "_pid"), ("_client/tasks.py", "client", "_endpoint"),
    ("_config.py", "other", "_key"), ("_transports/mock.py", "self._transport", "_errors"),
    ("integrations/openenv_harness.py", "harness", "_endpoint"),
    ("integrations/openenv_harness.py", "session", "_start"),
    ("server/_http/handshake.py", "server", "_registry"),
    ("server/_http/handshake.py", "self._server", "_registry"),
    ("_sansio/policies.py", "a string", "_lock"),  # its own __dict__, in __getstate__
}
#: Dependency names envlink uses without reading a dependency's internals: a method
#: documented for subclasses to override, called through ``super()`` by the override
#: (OpenTelemetry's ``MetricReader._receive_metrics``); an attribute asyncio probes on
#: a coroutine, which the sync facade's awaitable answers (never reads).
_PROTECTED = {("telemetry.py", "super()", "_receive_metrics"),
              ("_bridge/dispatch.py", "a string", "_is_coroutine")}


def _is_private(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return len(name) > 1 and name.startswith("_") and not dunder


def _defined_names(paths: Any, own_only: bool) -> set[str]:
    """Private names that the modules at ``paths`` define: functions, classes, module
    globals, imports, attributes they assign (``own_only``: only on ``self``/``cls``,
    plus ``__slots__``)."""
    found: set[str] = set()
    for path in paths:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if not own_only or (isinstance(node.value, ast.Name)
                                    and node.value.id in ("self", "cls")):
                    found.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            elif isinstance(node, ast.alias):
                found.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
                found |= {c.value for c in ast.walk(node.value)
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return {name for name in found if _is_private(name)}


def _dependency_private_names() -> set[str]:
    """Every private name asyncio, websockets and OpenTelemetry define, from their source."""
    import importlib

    names: set[str] = set()
    for dependency in _DEPENDENCIES:
        module = importlib.import_module(dependency)
        for root in module.__path__:
            names |= _defined_names(sorted(Path(root).rglob("*.py")), own_only=False)
    return names


def _private_reads(tree: ast.AST, dependency: set[str]) -> set[tuple[str, str]]:
    """``(receiver, name)`` of every read in ``tree`` that may be a dependency's private
    name: attributes not on ``self``/``cls`` (nor ``os``/``sys``), names imported from
    a dependency or from a private module of one, and such names given as strings
    (``getattr``), except in ``__slots__``."""
    reads: set[tuple[str, str]] = set()
    slots = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)
             for c in ast.walk(node.value)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in dependency:
            receiver = ast.unparse(node.value)
            if receiver not in ("self", "cls", "os", "sys"):
                reads.add((receiver, node.attr))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                _DEPENDENCIES):
            parts = (node.module or "").split(".")
            reads |= {(node.module or "", part) for part in parts if _is_private(part)}
            reads |= {(node.module or "", a.name) for a in node.names if _is_private(a.name)}
        elif isinstance(node, ast.Import):
            reads |= {(a.name, part) for a in node.names
                      if a.name.split(".")[0] in _DEPENDENCIES
                      for part in a.name.split(".") if _is_private(part)}
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value in dependency and id(node) not in slots):
            reads.add(("a string", node.value))
    return reads


def test_no_other_module_uses_a_dependencys_private_name() -> None:
    """Every private name of asyncio, websockets and OpenTelemetry that envlink reads is
    read in envlink._speedups only (which has a public fallback for each).

    The dependencies' private names come from their installed source, so a new one
    is seen without a list to keep. A name envlink also defines for itself (``_lock``,
    ``_loop``) counts as envlink's only on ``self``/``cls`` or where ``_OWN_OBJECTS``
    names the receiver as envlink's own object."""
    dependency = _dependency_private_names()
    assert {"_locked", "_waiters", "_get_running_loop", "_SPAN_KEY",
            "_RUNTIME_CONTEXT"} <= dependency  # the source was read
    own = _defined_names([p for p in SRC.rglob("*.py") if p.name != "_speedups.py"],
                         own_only=True)
    found: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        reads = _private_reads(ast.parse(path.read_text(encoding="utf-8")), dependency)
        if any(isinstance(n, ast.Attribute) and n.attr == "__new__"
               and isinstance(n.value, ast.Name) and n.value.id == "tuple"
               for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))):
            reads.add(("tuple", "__new__"))
        # A name envlink defines too is envlink's own on a receiver known to be
        # envlink's object; a dependency's anywhere else.
        reads = {(receiver, name) for receiver, name in reads
                 if name not in own or (rel, receiver, name) not in _OWN_OBJECTS}
        reads -= {(receiver, name) for receiver, name in reads
                  if (rel, receiver, name) in _PROTECTED}
        if reads:
            found[rel] = reads
    assert set(found) == {"_speedups.py"}, {k: v for k, v in found.items()
                                            if k != "_speedups.py"}
    # What _speedups reads is what it has fallbacks for; the list above is complete.
    assert {name for _, name in found["_speedups.py"]} >= {
        "_locked", "_waiters", "_get_running_loop", "_current_tasks", "_RUNTIME_CONTEXT",
        "_current_context", "_SPAN_KEY", "_BAGGAGE_KEY", "_propagators", "_TRACER_PROVIDER",
        "_METER_PROVIDER", "_ProxyMeterProvider", "_internal"}


def test_the_speedups_module_loads_neither_asyncio_nor_opentelemetry() -> None:
    """Its asyncio and OpenTelemetry imports are inside functions, so the sans-I/O core
    may import it."""
    tree = ast.parse((SRC / "_speedups.py").read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {(n.module or "").split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert not top & {"asyncio", "opentelemetry"}, top



def test_every_fast_path_is_in_use_where_the_switch_is_on() -> None:
    """With the switch on, each fast path is selected on the installed dependencies: a
    fast path that fell back to its public API (a renamed private name) fails here,
    where its own test above would only skip or pass through the fallback."""
    if not _speedups.ENABLED:
        pytest.skip(f"fast paths are off ({_speedups.SWITCH})")
    from pydantic_core import from_json

    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    try:  # a pydantic-core that reads longer integers than json.loads: parser not used
        from_json("1" * (limit + 1))
        long_integers = bool(limit)
    except ValueError:
        long_integers = False
    assert (_speedups.json_parser() is None) is long_integers
    assert _speedups.json_scanner() is not None
    assert _speedups.new_record is tuple.__new__
    assert _speedups.running_loop_getter() is not asyncio.get_running_loop
    assert _speedups.task_of_loop_getter().__name__ != "<lambda>"
    assert _speedups.current_context_getter() is not otel_context.get_current
    assert _speedups.context_attacher() != (otel_context.attach, otel_context.detach)
    assert _speedups.span_context_fields()
    assert _speedups.lock_fast_path()
    assert _speedups.lock_turns()[0] is not _speedups._take_lock_never
    assert _speedups.span_key() is not None and _speedups.baggage_key() is not None
    parts = [TraceContextTextMapPropagator(), W3CBaggagePropagator()]
    assert _speedups.composite_parts(CompositePropagator(parts)) == parts
