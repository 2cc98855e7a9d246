"""Imports point one way: pure parts do no I/O, only the transport imports websockets."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

SRC = Path(__file__).resolve().parents[1] / "src" / "envlink"
PURE = ["_errors.py", "_config.py", "_protocol.py", "_policies.py", "_journal.py",
        "_retry.py", "_session.py"]
IO_MODULES = {"asyncio", "socket", "ssl", "websockets", "selectors", "http", "urllib.request"}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names} | names


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    """errors, config, protocol, policies, journal, retry and session import no I/O."""
    names = top(imported(SRC / module))
    assert not names & IO_MODULES, names & IO_MODULES
    internal = {n for n in names if n.startswith("envlink.")}
    assert internal <= {f"envlink.{p[:-3]}" for p in PURE}, internal


def test_the_session_core_is_sans_io() -> None:
    """The session core imports neither asyncio, websockets nor opentelemetry."""
    names = top(imported(SRC / "_session.py"))
    assert not names & {"asyncio", "websockets", "opentelemetry", "trio", "anyio"}, names


def test_only_the_transport_imports_websockets() -> None:
    """Outside the reference server (an I/O layer of its own), only _websocket.py imports it."""
    users = sorted(p.name for p in SRC.glob("*.py") if "websockets" in top(imported(p)))
    assert users == ["_websocket.py"]


def test_telemetry_never_imports_the_client() -> None:
    """Telemetry and logging modules depend on nothing that talks to a server."""
    forbidden = {"envlink._client", "envlink._sync", "envlink._transport", "envlink._echo",
                 "envlink._websocket"}
    for name in ["_telemetry.py", "_logging.py", "telemetry.py"]:
        assert not imported(SRC / name) & forbidden, name


def test_the_bridge_knows_nothing_of_environments() -> None:
    """The generic bridge imports no client, protocol or transport module."""
    forbidden = {"envlink._client", "envlink._protocol", "envlink._transport", "envlink._echo",
                 "envlink._websocket",
                 "envlink._sync", "envlink.server"}
    assert not imported(SRC / "_bridge.py") & forbidden


def test_library_code_uses_the_opentelemetry_api_only() -> None:
    """Only the one-call configure helper and the demo may import the OpenTelemetry SDK."""
    allowed = {"telemetry.py", "_demo.py"}
    for path in SRC.rglob("*.py"):
        if path.name in allowed:
            continue
        sdk = {n for n in imported(path) if n.startswith("opentelemetry.sdk")}
        assert not sdk, f"{path.relative_to(SRC)} imports {sdk}"
