"""Imports point one way: the rules import-linter cannot state, stated on packages.

The package contracts (pure core, only the transports import websockets/httpx, telemetry
below the client, a generic bridge, the pool on the client's surface, only envlink.ray
imports Ray) live in pyproject.toml's ``[tool.importlinter]`` and run as ``lint-imports``
in CI. import-linter sees an external package as one node, so the rules about parts of
OpenTelemetry are checked here.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "envlink"


def modules(package: str = "") -> Iterator[tuple[str, Path]]:
    """(dotted name, path) of every module of ``envlink`` or of one of its packages."""
    base = SRC / package.replace(".", "/") if package else SRC
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def runtime_import_froms(path: Path) -> set[tuple[str, str]]:
    """(module, name) of every absolute import outside ``if TYPE_CHECKING:`` blocks."""
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


def test_the_contracts_cover_every_package() -> None:
    """Every private package of envlink appears in at least one import-linter contract."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text[text.index("[tool.importlinter]"):]
    named = set(re.findall(r'"(envlink\.[\w.]+)"', section))
    packages = {f"envlink.{p.name}" for p in SRC.iterdir()
                if p.is_dir() and p.name.startswith("_") and (p / "__init__.py").exists()}
    assert packages
    assert packages <= {n.split(".")[0] + "." + n.split(".")[1] for n in named
                        if n.startswith("envlink.")}


def test_library_code_uses_the_opentelemetry_api_only() -> None:
    """Only the one-call configure helper and the demo import the OpenTelemetry SDK."""
    allowed = {"envlink.telemetry", "envlink._cli.demo"}
    users = {name for name, path in modules()
             if any(m.startswith("opentelemetry.sdk") for m, _ in runtime_import_froms(path))}
    assert users <= allowed, users - allowed


@pytest.mark.parametrize("package", ["_sansio", "_transports", "_client"])
def test_the_client_uses_opentelemetry_for_context_propagation_only(package: str) -> None:
    """The client's packages create no spans or metrics: outside the propagation helper,
    the only OpenTelemetry API they use at run time is ``propagate``; the propagation
    helper reads the current context, span and baggage and nothing else."""
    propagation = {"opentelemetry.propagate", "opentelemetry.trace", "opentelemetry.baggage",
                   "opentelemetry.context", "opentelemetry.baggage.propagation",
                   "opentelemetry.propagators.composite",
                   "opentelemetry.trace.propagation.tracecontext"}
    for name, path in modules(package):
        used = {(m + "." + n) if m == "opentelemetry" else m
                for m, n in runtime_import_froms(path) if m.split(".")[0] == "opentelemetry"}
        allowed = propagation if name == "envlink._client.propagation" else {
            "opentelemetry.propagate"}
        assert used <= allowed, (name, used - allowed)


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
                          timeout=25, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_the_chaos_suite_uses_the_public_api_only() -> None:
    """tests/chaos imports envlink and envlink.server public names only (survives refactors)."""
    import envlink
    import envlink.server

    public = {"envlink": set(envlink.__all__), "envlink.server": set(envlink.server.__all__)}
    files = sorted((ROOT / "tests" / "chaos").glob("*.py"))
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


def test_the_import_contracts_hold() -> None:
    """lint-imports (in the dev extra) finds every contract of pyproject.toml kept."""
    linter = Path(sys.executable).with_name("lint-imports")
    assert linter.exists(), "import-linter is missing: pip install -e '.[dev]'"
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    done = subprocess.run([str(linter), "--no-cache"], capture_output=True, text=True,
                          timeout=25, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr


def test_telemetry_names_come_from_envlink_names_only() -> None:
    """Library modules take span, metric, attribute and event names from envlink.names,
    not through the modules that re-export them (the outcomes, which the bridge shares
    without knowing telemetry, are defined with the error tree)."""
    from envlink import names

    listed = set(names.__all__)
    routes: dict[str, set[str]] = {}
    for name, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.startswith("envlink") \
                    and node.module not in ("envlink.names", "envlink._errors"):
                found = {a.name for a in node.names} & listed
                if found:
                    routes.setdefault(name, set()).update(found)
    assert routes == {}, routes


def test_no_module_basename_is_used_twice() -> None:
    """Each module of the library has a name of its own (underscore aside), so a name in a
    traceback or a log says which module it is."""
    seen: dict[str, list[str]] = {}
    for name, path in modules():
        if path.name not in {"__init__.py", "__main__.py"}:
            seen.setdefault(path.stem.lstrip("_"), []).append(name)
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}
