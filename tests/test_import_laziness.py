"""`import envlink` stays light: what a plain client does not need is imported on first use.

Checks of ``sys.modules`` in a fresh interpreter, never timings (the import time
itself is measured by ``benchmarks/bench_import.py`` and ``benchmarks/run.py``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import envlink

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]

#: Not imported by `import envlink`, whatever the installed extras.
NEVER_AT_IMPORT = [
    "envlink.server",     # the reference server
    "envlink.ray",        # the Ray extra
    "ray",
    "envlink.telemetry",  # configure(), which imports the OpenTelemetry SDK
    "opentelemetry.sdk",
    "envlink._pool.pool",      # the pools and their placement, breakers and sync facade
    "envlink._pool.sync_pool",
    "envlink._pool.placement",
    "envlink._pool.breaker",
    "envlink._sync.sync_client",      # the sync facade's class (client.sync() imports it)
    "envlink.echo_env",      # the echo environment
    "envlink._transports.mock",      # the test transport
    "envlink._cli.demo",
    "envlink._cli.main",
    "websockets",         # the transport: imported by the first client that needs it
    "envlink._transports.websocket",
    "picows",             # the fast transport (the fast extra), the same way
    "envlink._transports.picows_ws",
    "uvloop",             # the bridge's loop (the fast extra): by the first bridge
    "httpx",              # HTTP requests through a proxy: imported by the first one
    "h11",                # direct HTTP requests: imported by the first one
    "envlink._transports.http11",
    "urllib.request",     # never: envlink reads the proxy variables itself
    "http.client",
    "structlog",          # only once something is logged that can be shown
    "envlink._telemetry.client_hook",  # the emitter: imported by the first client
    "envlink._telemetry.bridge_hook",  # and by the first bridge
    "envlink._telemetry.instruments",
    "envlink._telemetry.logs",
    "opentelemetry.metrics",
]


def loaded_after(code: str) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter; which of NEVER_AT_IMPORT are in sys.modules."""
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps({{m: m in sys.modules for m in {NEVER_AT_IMPORT!r}}}))\n")
    done = _run_python(probe)
    found: dict[str, bool] = json.loads(done.stdout.splitlines()[-1])
    return found



def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter from the checkout; its assertions must hold."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=50, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done

def test_import_envlink_leaves_the_rest_unloaded() -> None:
    """`import envlink` imports none of the server, Ray, the SDK, the pools, websockets,
    urllib.request or structlog."""
    loaded = loaded_after("import envlink")
    assert not [m for m, yes in loaded.items() if yes]


MOCK_STEP = """
import envlink

def answer(request):
    return {"type": "observation", "data": {"observation": {"n": 1}, "done": False}}

client = envlink.GenericEnvClient("ws://127.0.0.1:9", transport=envlink.MockTransport(answer))
with client.sync() as env:
    assert env.reset().observation == {"n": 1}
    assert env.step({"x": 1}).observation == {"n": 1}
"""


def test_a_client_on_the_mock_transport_loads_no_websockets() -> None:
    """A client given its own transport resets and steps (sync facade, telemetry hooks
    included) without ever importing websockets, urllib.request or structlog; one with the
    default transport imports websockets at construction."""
    loaded = loaded_after(MOCK_STEP)
    assert loaded["envlink._transports.mock"] and loaded["envlink._sync.sync_client"]
    assert loaded["envlink._telemetry.client_hook"] and loaded["envlink._telemetry.bridge_hook"]
    assert not loaded["websockets"] and not loaded["urllib.request"], loaded
    assert not loaded["structlog"] and not loaded["envlink.server"], loaded
    loaded = loaded_after("import envlink\nenvlink.EnvClient('ws://127.0.0.1:9')")
    if importlib.util.find_spec("picows") is not None:  # "auto": picows, and not websockets
        assert loaded["picows"] and loaded["envlink._transports.picows_ws"]
        assert not loaded["websockets"], loaded
    else:
        assert loaded["websockets"] and loaded["envlink._transports.websocket"]
    assert not loaded["structlog"] and not loaded["envlink.server"]
    loaded = loaded_after("import os\nos.environ['ENVLINK_TRANSPORT'] = 'websockets'\n"
                          "import envlink\nenvlink.EnvClient('ws://127.0.0.1:9')")
    assert loaded["websockets"] and loaded["envlink._transports.websocket"]
    assert not loaded["picows"] and not loaded["envlink._transports.picows_ws"]


def test_debug_lines_do_not_import_structlog_but_warnings_do() -> None:
    """With structlog never imported (so never configured) debug and info lines are
    dropped without importing it; a warning still reaches stderr through structlog."""
    code = ("import sys\nfrom envlink._telemetry.logs import get_logger\nlog = get_logger()\n"
            "log.debug('envlink.quiet_debug', x=1)\nlog.info('envlink.quiet_info')\n"
            "assert 'structlog' not in sys.modules\n"
            "log.warning('envlink.loud_warning', y=2)\n"
            "assert 'structlog' in sys.modules\n")
    done = _run_python(code)
    assert "envlink.loud_warning" in done.stderr
    assert "quiet" not in done.stderr + done.stdout


def test_lazy_names_resolve_to_their_modules_objects() -> None:
    """Every public name imported on first access is its module's own object, cached on
    the package after the first access, and listed by dir()."""
    import importlib

    lazy: dict[str, str] = envlink._LAZY
    assert set(lazy) <= set(envlink.__all__) | {"EchoEnv", "EchoObservation"}  # two aliases
    for name, module in lazy.items():
        assert getattr(envlink, name) is getattr(importlib.import_module(module), name)
        assert name in vars(envlink)
        assert name in dir(envlink)
    assert set(envlink.__all__) <= set(dir(envlink))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        _ = envlink.NoSuchName


def test_star_import_and_from_import_of_lazy_names() -> None:
    """`from envlink import *` and `from envlink import EnvPool` work in a fresh
    interpreter (PEP 562 resolves them on demand)."""
    code = ("from envlink import EnvPool, SyncEnvClient, configure\n"
            "ns = {}\nexec('from envlink import *', ns)\n"
            "import envlink\n"
            "missing = [n for n in envlink.__all__ if n not in ns]\n"
            "assert not missing, missing\n"
            "assert ns['EnvPool'] is EnvPool and ns['configure'] is configure\n")
    _run_python(code)


def test_protocol_models_are_built_at_first_use() -> None:
    """`import envlink` builds no validator of the protocol frames (pydantic defer_build);
    the first reset and step build none either (a well-formed observation frame is checked
    without its model, built only for a frame those checks do not accept; nor the response
    union, built only to word an invalid frame's error, nor the server's request adapter,
    nor the request models a plain dict step does without), and encode and decode work."""
    code = ("from envlink._sansio import protocol as p\n"
            "frames = [p.ResetRequest, p.StepRequest, p._ObservationModel, p.ErrorFrame]\n"
            "assert not any(f.__pydantic_complete__ for f in frames)\n"
            + MOCK_STEP +
            # An older pydantic builds a TypeAdapter at once (and has no such flag):
            # there, only the models are deferred.
            "assert not p._ObservationModel.__pydantic_complete__  # checked without it\n"
            "if hasattr(p._RESPONSE_ADAPTER, 'pydantic_complete'):\n"
            "    assert not p._RESPONSE_ADAPTER.pydantic_complete  # errors only\n"
            "    assert not p._REQUEST_ADAPTER.pydantic_complete  # a server's, never built\n"
            # A plain dict step is serialised without its request model (encode_call).
            "assert not p.StepRequest.__pydantic_complete__\n"
            "text = p.encode_request(p.StepRequest(data={'a': 1.5}))\n"
            "assert text == b'{\"type\":\"step\",\"data\":{\"a\":1.5}}', text\n"
            "assert p.StepRequest.__pydantic_complete__\n"
            "frame = p.decode_response('{\"type\":\"error\",\"data\":{\"message\":\"m\"}}')\n"
            "assert isinstance(frame, p.ErrorFrame) and frame.data.code == 'EXECUTION_ERROR'\n")
    _run_python(code)


def test_a_bridge_still_gets_envlinks_telemetry_by_default() -> None:
    """The bridge's default hook, installed by `import envlink` without importing the
    emitter, is envlink's OpenTelemetry emitter: a bare Bridge call makes its span."""
    code = ("import envlink\n"
            "from opentelemetry.sdk.trace import TracerProvider\n"
            "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
            "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
            "InMemorySpanExporter\n"
            "exporter = InMemorySpanExporter()\n"
            "provider = TracerProvider()\n"
            "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
            "async def nothing():\n    return 7\n"
            "with envlink.Bridge(tracer_provider=provider) as bridge:\n"
            "    assert bridge.call(nothing, timeout=10, method='nothing') == 7\n"
            "names = [s.name for s in exporter.get_finished_spans()]\n"
            "assert names == ['envlink.bridge nothing'], names\n")
    _run_python(code)


def test_a_first_connect_under_auto_imports_no_httpx() -> None:
    """`on_session_lost="auto"` asks the server for a detached session before its first
    upgrade: that direct request imports neither httpx nor structlog (its "no detached
    sessions here" line is a debug one)."""
    from envlink.server import ServerThread

    with ServerThread(env="echo") as st:
        loaded = loaded_after(
            "import envlink\n"
            f"env = envlink.GenericEnvClient({st.url!r}, on_session_lost='auto').sync()\n"
            "env.connect()\nassert env.recovery == 'envlink-resume'\nenv.close()")
    transport = ("envlink._transports.picows_ws" if importlib.util.find_spec("picows")
                 else "envlink._transports.websocket")
    assert loaded[transport] and loaded["h11"]
    assert not loaded["httpx"] and not loaded["structlog"], loaded
