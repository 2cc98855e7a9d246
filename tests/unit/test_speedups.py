"""Each private-API fast path agrees with its public fallback; one switch turns them off."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

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
    assert repr(parse(text)) == repr(json.loads(text))


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
            parse(text)
        return
    try:
        got = parse(text)
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
        "f = decode_response('{\"type\":\"state\",\"data\":{\"step_count\":2}}', max_size=None)\n"
        "assert f.data['step_count'] == 2, f\n"
        "assert trace_carrier() == {}\n")
    env = {**os.environ, _speedups.SWITCH: "1", "PYTHONPATH": str(SRC.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=25, env=env)
    assert done.returncode == 0, done.stderr


def test_no_other_module_uses_a_dependencys_private_name() -> None:
    """The private names the fast paths use appear in envlink._speedups only."""
    private = {"_get_running_loop", "_TRACER_PROVIDER", "_METER_PROVIDER", "_BAGGAGE_KEY",
               "_propagators", "_ProxyMeterProvider", "c_make_scanner", "_internal"}
    users: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                  for a in n.names}
        names |= {n.value for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        if used := names & private:
            users[str(path.relative_to(SRC))] = used
        if any(isinstance(n, ast.Attribute) and n.attr == "__new__"
               and isinstance(n.value, ast.Name) and n.value.id == "tuple"
               for n in ast.walk(tree)):
            users.setdefault(str(path.relative_to(SRC)), set()).add("tuple.__new__")
    assert set(users) == {"_speedups.py"}, users


def test_the_speedups_module_loads_neither_asyncio_nor_opentelemetry() -> None:
    """Its asyncio and OpenTelemetry imports are inside functions, so the sans-I/O core
    may import it."""
    tree = ast.parse((SRC / "_speedups.py").read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {(n.module or "").split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert not top & {"asyncio", "opentelemetry"}, top

