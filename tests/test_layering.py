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
    import envlink.integrations
    import envlink.server

    public = {"envlink": set(envlink.__all__), "envlink.server": set(envlink.server.__all__),
              "envlink.integrations": set(envlink.integrations.__all__)}
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


def test_no_module_imports_another_packages_private_names() -> None:
    """A module takes from another package only the names it offers (no ``_helper``);
    importing a private module itself is how packages are used."""
    found = []
    for name, path in modules():
        package = ".".join(name.split(".")[:2])
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                    and node.module.startswith("envlink")):
                continue
            if ".".join(node.module.split(".")[:2]) == package:
                continue
            base = SRC.parent.joinpath(*node.module.split("."))
            for alias in node.names:
                is_module = (base / f"{alias.name}.py").exists() or (base / alias.name).is_dir()
                if alias.name.startswith("_") and not alias.name.startswith("__") \
                        and not is_module:
                    found.append(f"{name}: {node.module}.{alias.name}")
    assert found == []


# ------------------------------------------------------- the core owns its state

#: What the layers above the sans-I/O core call a session core: ``core``, ``self.core``,
#: ``client._core``, ``ctx.core``, ``session_core``. The rule below is scoped by these
#: names rather than by package, because the field names are common words: the
#: server's sessions, the pool's clients (whose ``on_session_lost`` is a public
#: setter), a connect report and Ray's mirrors have ``session_id``, ``extensions``,
#: ``journal`` or ``on_session_lost`` of their own; the test after it holds the client
#: layers to the naming.
_CORE_NAME = re.compile(r"(?:.*_)?core")


def session_core_fields() -> frozenset[str]:
    """The state of ``SessionCore``: its slots, class annotations and ``self.x =`` fields."""
    tree = ast.parse((SRC / "_sansio" / "session.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SessionCore")
    found: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            found.update(e.value for e in ast.walk(node.value)
                         if isinstance(e, ast.Constant) and isinstance(e.value, str))
        for target in _targets(node):
            for e in ast.walk(target):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) \
                        and e.value.id == "self" and isinstance(e.ctx, ast.Store):
                    found.add(e.attr)
    return frozenset(found - {"__slots__"})


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _names_core(expr: ast.expr, aliases: set[str]) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in aliases or _CORE_NAME.fullmatch(expr.id.lstrip("_")) is not None
    if isinstance(expr, ast.Attribute):
        return _CORE_NAME.fullmatch(expr.attr.lstrip("_")) is not None
    return False


def _core_aliases(scope: ast.AST) -> set[str]:
    """Local names bound to a core in ``scope`` (``c = self._core``, ``a, c = x, ctx.core``)."""
    aliases: set[str] = set()
    for node in ast.walk(scope):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs: list[tuple[ast.expr, ast.expr]] = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    and len(target.elts) == len(node.value.elts):
                pairs = list(zip(target.elts, node.value.elts, strict=True))
            aliases.update(t.id for t, v in pairs
                           if isinstance(t, ast.Name) and _names_core(v, aliases))
    return aliases


def core_field_writes(source: str, fields: frozenset[str]) -> list[str]:
    """Where ``source`` assigns, augments or deletes a core field on something other than
    ``self``, or calls ``setattr``/``delattr`` on a core: ``line: code`` each."""
    tree = ast.parse(source)
    found: set[tuple[int, str]] = set()
    scopes = [tree] + [n for n in ast.walk(tree)
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for scope in scopes:
        aliases = _core_aliases(scope)
        for node in ast.walk(scope):
            for target in _targets(node):
                for e in ast.walk(target):
                    if isinstance(e, ast.Attribute) and isinstance(e.ctx, (ast.Store, ast.Del)) \
                            and e.attr in fields and _names_core(e.value, aliases):
                        found.add((e.lineno, ast.unparse(e)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("setattr", "delattr") and node.args \
                    and _names_core(node.args[0], aliases):
                found.add((node.lineno, ast.unparse(node)))
    return [f"{line}: {code}" for line, code in sorted(found)]


def test_no_module_outside_the_core_assigns_its_fields() -> None:
    """The asyncio layer changes a session only through the core's named inputs: no module
    outside ``envlink._sansio`` assigns, augments, deletes or setattr()s a field of a
    session core."""
    fields = session_core_fields()
    assert {"episode", "link", "journal", "resume_token", "detached_id", "policy"} <= fields
    found = {name: writes for name, path in modules()
             if not name.startswith("envlink._sansio")
             and (writes := core_field_writes(path.read_text(), fields))}
    assert found == {}


def test_the_core_field_rule_catches_each_way_of_writing_one() -> None:
    """The rule flags a field written through each name a core goes by, an alias, a tuple,
    an augmented assignment, del and setattr, and passes the core's own writes and other
    objects' fields of the same names."""
    fields = session_core_fields()
    bad = '''
def f(self, client, ctx, driver):
    core = self.core
    core.link = None
    self._core.episode = 1
    client._core.resume_token = None
    ctx.core.detached_id = None
    driver.core.journal += 1
    session_core.policy = 2
    c = client._core
    c.production = True
    x, k = 1, ctx.core
    k.session_id, y = "s", 2
    del core.lost_by
    setattr(core, "link", None)
'''
    flagged = [int(line.split(":")[0]) for line in core_field_writes(bad, fields)]
    assert flagged == [4, 5, 6, 7, 8, 9, 11, 13, 14, 15]
    good = '''
class SessionCore:
    def f(self, session, made, report):
        self.link = None
        session.session_id = "s"
        made.on_session_lost = "replay"
        report.extensions = True
        core = self
        core.journal.episode_id = "e"
        setattr(made, "link", None)
'''
    assert core_field_writes(good, fields) == []


def test_every_session_core_goes_by_a_core_name() -> None:
    """Outside the core, every variable, parameter and attribute that holds a SessionCore
    (annotated with it, or assigned ``SessionCore(...)``) is named ``core``, ``_core`` or
    ``..._core``: the names the rule above recognises."""
    def holds_core(annotation: ast.expr | None) -> bool:
        return annotation is not None and "SessionCore" in ast.unparse(annotation)

    def name_of(target: ast.expr) -> str:
        return target.id if isinstance(target, ast.Name) else \
            target.attr if isinstance(target, ast.Attribute) else ast.unparse(target)

    found = []
    for name, path in modules():
        if name.startswith("envlink._sansio"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named: list[str] = []
            if isinstance(node, ast.arg) and holds_core(node.annotation):
                named.append(node.arg)
            elif isinstance(node, ast.AnnAssign) and holds_core(node.annotation):
                named.append(name_of(node.target))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and ast.unparse(node.value.func).endswith("SessionCore"):
                named.extend(name_of(t) for t in node.targets)
            found.extend(f"{name}: {n}" for n in named
                         if _CORE_NAME.fullmatch(n.lstrip("_")) is None)
    assert found == []


_EXCEPTION_CLASSES = r"""
import importlib, inspect, json, pkgutil, sys
import envlink
found, unimported = [], []
for info in pkgutil.walk_packages(envlink.__path__, "envlink."):
    if info.name.endswith("__main__"):
        continue
    try:
        module = importlib.import_module(info.name)
    except ImportError as exc:  # an optional extra (verifiers, Ray...) not installed
        missing = exc if isinstance(exc, ModuleNotFoundError) else exc.__cause__
        if not isinstance(missing, ModuleNotFoundError) or \
                (missing.name or "envlink").partition(".")[0] == "envlink":
            raise
        unimported.append(info.name)
        continue
    for name, value in vars(module).items():
        if (inspect.isclass(value) and issubclass(value, BaseException)
                and value.__module__ == info.name and value.__qualname__ == name):
            found.append([info.name, name])
json.dump([found, unimported], sys.stdout)
"""


def _exception_classes_by_source(module: str) -> list[tuple[str, str]]:
    """The exception classes a module defines, read from its source: for a module whose
    optional extra is not installed, so it cannot be imported. A class counts when a
    base is a builtin exception, an ``envlink._errors`` class, a name ending in
    ``Error``, ``Exception`` or ``Warning``, or an exception class defined before it."""
    import builtins

    from envlink import _errors

    known = {n for n, v in vars(builtins).items()
             if isinstance(v, type) and issubclass(v, BaseException)}
    known |= {n for n, v in vars(_errors).items()
              if isinstance(v, type) and issubclass(v, BaseException)}
    path = SRC.joinpath(*module.split(".")[1:]).with_suffix(".py")
    if not path.exists():
        path = SRC.joinpath(*module.split(".")[1:], "__init__.py")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
        if bases & known or any(b.endswith(("Error", "Exception", "Warning")) for b in bases):
            known.add(node.name)
            found.append((module, node.name))
    return found



def test_every_exception_class_is_defined_in_the_error_module() -> None:
    """One error tree in one module: every exception class without a leading underscore
    is defined in ``envlink._errors``, and no two exception classes share a name."""
    out = subprocess.run([sys.executable, "-c", _EXCEPTION_CLASSES], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    import json

    imported, unimported = json.loads(out)
    classes = [tuple(pair) for pair in imported]
    # A module whose extra is missing is still checked, from its source.
    classes += [pair for module in unimported for pair in _exception_classes_by_source(module)]
    assert ("envlink._errors", "EnvlinkError") in classes  # the walk saw the tree
    elsewhere = sorted(f"{module}.{name}" for module, name in classes
                       if module != "envlink._errors" and not name.startswith("_"))
    assert elsewhere == [], "public exception classes outside envlink._errors"
    names = [name.lstrip("_") for _module, name in classes]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_one_module_frames_a_json_rpc_request() -> None:
    """The client's JSON-RPC envelope (``"jsonrpc": "2.0"``) is built in
    ``_sansio/jsonrpc.py`` alone: the ``mcp`` frame and ``POST /mcp`` both take it from
    there (the reference server frames its own answers)."""
    found = [name for name, path in modules()
             if re.search(r"""["']jsonrpc["']\s*:""", path.read_text())
             and name != "envlink._sansio.jsonrpc" and not name.startswith("envlink.server")]
    assert found == []


def import_graph() -> dict[str, set[str]]:
    """Every import of every envlink module, wherever it is written (module level, in a
    function, under ``if TYPE_CHECKING:``): module -> the envlink modules it imports."""
    names = {name for name, _ in modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in names else base
                             for a in node.names)
        graph[name] = {target for target in found if target in names and target != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected parts of the graph with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = set()
            while True:
                top = stack.pop()
                part.add(top)
                if top == node:
                    break
            if len(part) > 1:
                cycles.append(part)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def _folder(module: str) -> str:
    """The folder a module's file is in (a package's ``__init__`` is in its own)."""
    path = SRC.parent.joinpath(*module.split("."))
    return module if path.is_dir() else module.rpartition(".")[0]


def test_no_import_cycle_between_folders_and_at_most_one_inside_a_folder() -> None:
    """With every import counted, no two folders of envlink import each other (directly
    or around a loop), and inside a folder at most one group of modules does."""
    cycles = import_cycles(import_graph())
    across = sorted(sorted(c) for c in cycles if len({_folder(m) for m in c}) > 1)
    assert across == []
    per_folder: dict[str, list[list[str]]] = {}
    for cycle in cycles:
        per_folder.setdefault(_folder(min(cycle)), []).append(sorted(cycle))
    assert {f: c for f, c in per_folder.items() if len(c) > 1} == {}


def test_the_cycle_finder_sees_a_cycle_through_a_type_checking_import() -> None:
    """A self-test of the graph: an import under ``if TYPE_CHECKING:`` and one inside a
    function count, and a loop through them is found."""
    graph = {"a.x": {"a.y"}, "a.y": {"b.z"}, "b.z": {"a.x"}, "b.w": set()}
    assert import_cycles(graph) == [{"a.x", "a.y", "b.z"}]
    source = SRC / "_sync" / "sync_client.py"  # imports the journal for type checking alone
    assert "envlink._sansio.journal" in import_graph()["envlink._sync.sync_client"], source



def test_at_most_twelve_modules_directly_in_the_package() -> None:
    """The top level of ``src/envlink`` fits on one screen: at most 12 modules."""
    assert len(sorted(SRC.glob("*.py"))) <= 12, sorted(p.name for p in SRC.glob("*.py"))
