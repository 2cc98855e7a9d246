"""Imports point one way: pure parts do no I/O, only the transport imports websockets."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

SRC = Path(__file__).resolve().parents[1] / "src" / "envlink"
PURE = ["_errors.py", "_config.py", "_sansio/protocol.py", "_sansio/policies.py",
        "_sansio/journal.py",
        "_sansio/retry.py", "_sansio/session.py", "_pool/breaker.py", "_pool/placement.py"]
IO_MODULES = {"asyncio", "socket", "ssl", "websockets", "selectors", "http", "urllib.request"}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def runtime_imports(path: Path) -> set[str]:
    """Imports outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
               for n in ast.walk(node)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names} | names


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    """errors, config, protocol, policies, journal, retry, session, breaker, placement: no I/O."""
    names = top(imported(SRC / module))
    assert not names & IO_MODULES, names & IO_MODULES
    internal = {n for n in names if n.startswith("envlink.")}
    assert internal <= {"envlink." + p[:-3].replace("/", ".") for p in PURE}, internal


def test_the_session_core_is_sans_io() -> None:
    """The session core imports neither asyncio, websockets nor opentelemetry."""
    names = top(imported(SRC / "_sansio/session.py"))
    assert not names & {"asyncio", "websockets", "opentelemetry", "trio", "anyio"}, names


def test_only_the_transport_imports_websockets() -> None:
    """Outside the reference server (an I/O layer of its own), only the WebSocket transport
    imports it."""
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if "websockets" in top(imported(p)) and p.parts[-2] != "server")
    assert users == ["_transports/websocket.py"]


def test_telemetry_never_imports_the_client() -> None:
    """Telemetry and logging modules depend on nothing that talks to a server."""
    forbidden = {"envlink._client.client", "envlink._client.sync_client",
                 "envlink._transports.base", "envlink._client.echo_env",
                 "envlink._transports.websocket"}
    for name in ["_telemetry/instruments.py", "_telemetry/logs.py", "telemetry.py"]:
        assert not imported(SRC / name) & forbidden, name


BRIDGE = sorted((SRC / "_bridge").glob("*.py"))


@pytest.mark.parametrize("path", BRIDGE, ids=lambda p: p.name)
def test_the_bridge_knows_nothing_of_environments(path: Path) -> None:
    """The generic bridge imports no client, protocol or transport module."""
    forbidden = {"envlink._client.client", "envlink._sansio.protocol", "envlink._transports.base",
                 "envlink._client.echo_env",
                 "envlink._transports.websocket",
                 "envlink._client.sync_client", "envlink.server"}
    assert not imported(path) & forbidden


@pytest.mark.parametrize("path", BRIDGE, ids=lambda p: p.name)
def test_the_bridge_imports_no_telemetry(path: Path) -> None:
    """The generic bridge reports to hooks: it imports neither envlink's telemetry nor
    OpenTelemetry (outside type annotations); of envlink, only errors and the pure timeout
    helpers."""
    names = imported(path)
    envlink = {n for n in names if n.startswith("envlink.") and not n.startswith("envlink._bridge")}
    assert envlink <= {"envlink._errors", "envlink._config", "envlink._deadlines"}, envlink
    assert not {n for n in runtime_imports(path) if n.startswith("opentelemetry")}


def test_the_bridge_is_split_on_its_seams() -> None:
    """Loop thread, hand-off, adapters, proxy and hooks are modules of their own."""
    assert {p.name for p in BRIDGE} >= {"loop.py", "handoff.py", "adapters.py", "proxy.py",
                                         "hooks.py", "bridge.py"}


def test_library_code_uses_the_opentelemetry_api_only() -> None:
    """Only the one-call configure helper and the demo may import the OpenTelemetry SDK."""
    allowed = {"telemetry.py", "demo.py"}
    for path in SRC.rglob("*.py"):
        if path.name in allowed:
            continue
        sdk = {n for n in imported(path) if n.startswith("opentelemetry.sdk")}
        assert not sdk, f"{path.relative_to(SRC)} imports {sdk}"


def test_the_pool_builds_on_the_clients_public_surface() -> None:
    """EnvPool's modules never reach below the client: no transport, protocol or server."""
    forbidden = {"envlink._transports.base", "envlink._sansio.protocol", "envlink.server",
                 "websockets"}
    for path in [*sorted((SRC / "_pool").glob("*.py")), SRC / "ray.py"]:
        assert not top(imported(path)) & forbidden, path.name


def test_only_envlink_ray_imports_ray() -> None:
    """Ray is an optional extra: envlink/ray.py is the only module that imports it."""
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if "ray" in top(imported(p)))
    assert users == ["ray.py"]


def test_import_envlink_never_imports_ray() -> None:
    """`import envlink` (pool, sync facade, telemetry included) leaves Ray unloaded."""
    code = ("import sys, envlink, envlink.telemetry, envlink.server\n"
            "from envlink import EnvPool\n"
            "EnvPool('ws://127.0.0.1:9', 2).sync().close()\n"
            "loaded = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.'))\n"
            "assert not loaded, loaded\n"
            "import envlink._pool.shard\n"
            "assert 'ray' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=25, cwd=SRC.parents[1])
    assert done.returncode == 0, done.stderr


#: The client: a sans-I/O core, the retry and recovery logic, and its asyncio driver.
CLIENT = ["_sansio/session.py", "_sansio/retry.py", "_client/recovery.py", "_client/events.py",
          "_client/driver.py", "_client/connector.py", "_client/client.py", "_transports/mock.py",
          "_transports/base.py", "_transports/http.py", "_client/mcp.py"]


def runtime_import_froms(path: Path) -> set[tuple[str, str]]:
    """(module, name) of every ``from module import name`` outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
               for n in ast.walk(node)}
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update((node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            found.update((a.name, "") for a in node.names)
    return found


@pytest.mark.parametrize("module", CLIENT)
def test_the_client_emits_telemetry_only_through_its_hooks(module: str) -> None:
    """No client module creates spans, records metrics or logs: the emitter does.

    The only OpenTelemetry API the client itself uses is ``propagate`` (the trace
    context it sends to the server); structlog and envlink's telemetry modules are
    imported only by the emitter, ``_telemetry/client_hook.py``, which the client's
    constructor installs.
    """
    froms = runtime_import_froms(SRC / module)
    otel = {(m, n) for m, n in froms if m.split(".")[0] == "opentelemetry"}
    assert otel <= {("opentelemetry", "propagate")}, otel
    modules = {m for m, _ in froms}
    forbidden = {"structlog", "logging", "envlink._telemetry.logs",
                 "envlink._telemetry.instruments",
                 "envlink._telemetry.client_hook"}
    if module == "_client/client.py":
        forbidden.discard("envlink._telemetry.client_hook")  # wires the default hook, see below
    if module == "_client/events.py":
        forbidden.discard("logging")  # a user's hook that raises is reported, as the bridge does
    assert not modules & forbidden, module


def test_the_propagation_helper_only_reads_the_trace_context() -> None:
    """_propagation (the driver's per-frame trace context) uses the OpenTelemetry API's
    propagation, current context, current-span and baggage lookup only, and no envlink
    module."""
    froms = runtime_import_froms(SRC / "_client/propagation.py")
    otel = {(m, n) for m, n in froms if m.split(".")[0] == "opentelemetry"}
    assert otel == {("opentelemetry", "propagate"), ("opentelemetry", "trace"),
                    ("opentelemetry", "baggage"), ("opentelemetry", "context"),
                    ("opentelemetry.baggage.propagation", "W3CBaggagePropagator"),
                    ("opentelemetry.propagators.composite", "CompositePropagator"),
                    ("opentelemetry.trace.propagation.tracecontext",
                     "TraceContextTextMapPropagator")}, otel
    assert not {m for m, _ in froms if m.startswith("envlink")}


def test_only_the_client_module_knows_the_emitter() -> None:
    """The default telemetry hook is wired in one place: the client's constructor."""
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if "envlink._telemetry.client_hook" in imported(p))
    assert users == ["_client/client.py", "telemetry.py"]


def test_client_modules_point_one_way() -> None:
    """core <- retry/recovery <- connector <- driver <- client: nothing imports upward."""
    order = ["_sansio/session.py", "_sansio/retry.py", "_client/events.py", "_client/recovery.py",
             "_client/connector.py",
             "_client/driver.py", "_client/client.py"]
    for i, module in enumerate(order):
        later = {"envlink." + m[:-3].replace("/", ".") for m in order[i + 1:]}
        assert not imported(SRC / module) & later, module


SERVER = SRC / "server"


def test_the_server_dispatch_is_pure() -> None:
    """What a frame means and what to answer is decided without sockets, asyncio, websockets
    or telemetry, so conformance tests drive it directly; fault decisions are pure too."""
    for name in ("_dispatch.py", "_faults.py", "_environments/environment.py"):
        names = top(runtime_imports(SERVER / name))
        assert not names & (IO_MODULES | {"opentelemetry", "threading"}), (name, names)
        internal = {n for n in names if n.startswith("envlink.")}
        assert internal <= {"envlink._errors", "envlink._sansio.protocol",
                            "envlink.server._environments.environment",
                            "envlink.server._faults", "envlink.server._store"}, (name, internal)


def test_only_the_server_io_layers_import_websockets() -> None:
    """In the server, websockets is used by the listener, the handshake, the connection
    handle and the POST /mcp reader only (others name its types in annotations at most)."""
    users = sorted(p.name for p in SERVER.glob("*.py")
                   if "websockets" in top(runtime_imports(p)))
    assert users == ["_connection.py", "_handshake.py", "_mcp_http.py", "_server.py"]


def test_the_chaos_suite_uses_the_public_api_only() -> None:
    """tests/chaos imports envlink and envlink.server public names only (survives refactors)."""
    import envlink
    import envlink.server

    public = {"envlink": set(envlink.__all__), "envlink.server": set(envlink.server.__all__)}
    chaos = SRC.parents[1] / "tests" / "chaos"
    files = sorted(chaos.glob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("envlink"):
                        assert alias.name in public, (path.name, alias.name)
            elif isinstance(node, ast.ImportFrom) and node.module \
                    and node.module.startswith("envlink"):
                assert node.module in public, (path.name, node.module)
                names = {a.name for a in node.names}
                assert names <= public[node.module], (path.name, names - public[node.module])


def test_the_deadline_module_depends_on_the_error_tree_only() -> None:
    """_timeouts (used by client, transport and bridge) imports no other envlink module."""
    internal = {n for n in imported(SRC / "_deadlines.py") if n.startswith("envlink")}
    assert internal == {"envlink._errors"}, internal


def test_the_http_client_depends_on_the_error_tree_only() -> None:
    """_http (POST /mcp for OpenEnv detached sessions, GET /health and the discovery
    endpoints) imports no websockets and no other envlink module but the errors; only the
    transport, the connector and discovery use it."""
    names = imported(SRC / "_transports/http.py")
    assert "websockets" not in top(names)
    assert {n for n in names if n.startswith("envlink.")} <= {"envlink._errors"}
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if "envlink._transports.http" in imported(p))
    assert users == ["_client/connector.py", "_client/discovery.py", "_transports/websocket.py"]


@pytest.mark.parametrize("module", [*CLIENT, "_telemetry/client_hook.py", "names.py",
                                    "_transports/websocket.py", "_config.py", "_sansio/policies.py",
                                    "_sansio/protocol.py", "_sansio/journal.py"])
def test_client_modules_stay_small(module: str) -> None:
    """A client module stays under 600 lines and each of its classes under 420."""
    text = (SRC / module).read_text()
    assert len(text.splitlines()) <= 600, module
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            assert node.end_lineno - node.lineno + 1 <= 420, f"{module}: {node.name}"
