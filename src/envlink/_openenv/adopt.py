"""Typed clients of existing environment packages, used through envlink unedited.

An environment package (OpenEnv's ``envs/*``, a Hub Space, a PyPI ``openenv-*``
package) ships a client that subclasses OpenEnv's ``EnvClient`` or ``MCPToolClient``
and implements ``_step_payload``, ``_parse_result`` and ``_parse_state`` with its own
models. :func:`adopt` rebuilds that class on envlink's client: the same name, the
same hooks, the same extra methods and models, with envlink's deadlines, reconnects
and recovery underneath. The package is not edited, and envlink never imports
OpenEnv: the package's classes bring it along.

How: every class of the package's hierarchy is rebuilt with its OpenEnv base
replaced by envlink's (``EnvClient``, ``GenericEnvClient``, or :class:`McpToolAdapter`
for the MCP tool clients); the functions are the package's own, with their
``super()`` re-pointed at the rebuilt class. A package class that overrides one of
OpenEnv's private I/O methods (``_send_and_receive``, ``_connect_async``...) is
refused: envlink does that I/O itself, and ignoring the override would change what
the package meant.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from envlink._bridge.dispatch import dispatched
from envlink._client.client import EnvClient, GenericEnvClient
from envlink._openenv.mcp_client import MCPToolClient

__all__ = ["McpToolAdapter", "adopt", "is_openenv_client"]

_C = TypeVar("_C", bound=type)

#: OpenEnv's hooks, which a package's client implements and envlink calls.
HOOKS = frozenset({"_step_payload", "_parse_result", "_parse_state"})
#: Where OpenEnv defines its client bases (``openenv_core`` before the rename).
_OPENENV_PACKAGES = ("openenv.core.", "openenv_core.")
_ENV_CLIENT = ("env_client", "EnvClient")
_GENERIC = ("generic_client", "GenericEnvClient")
_MCP_BASE = ("mcp_client", "MCPClientBase")
_MCP_TOOL = ("mcp_client", "MCPToolClient")
#: Class attributes never copied from a package class into its rebuilt twin.
_NOT_COPIED = frozenset({"__dict__", "__weakref__", "__orig_bases__", "__parameters__",
                         "__abstractmethods__", "_abc_impl", "__slots__"})

_adopted: dict[type, type] = {}
_lock = threading.RLock()


def _openenv_role(cls: type) -> tuple[str, str] | None:
    """``(module tail, name)`` of one of OpenEnv's client bases, else ``None``."""
    module = getattr(cls, "__module__", "") or ""
    for package in _OPENENV_PACKAGES:
        if module.startswith(package):
            role = (module[len(package):], cls.__qualname__)
            if role in (_ENV_CLIENT, _GENERIC, _MCP_BASE, _MCP_TOOL):
                return role
    return None


def is_openenv_client(cls: object) -> bool:
    """Whether ``cls`` is a class deriving from OpenEnv's ``EnvClient`` (0.10's or older)."""
    return isinstance(cls, type) and any(_openenv_role(c) == _ENV_CLIENT for c in cls.__mro__)


# ------------------------------------------------------------------ the MCP tool client


class McpToolAdapter(MCPToolClient[Any]):
    """OpenEnv's ``MCPToolClient`` surface on envlink's, for adopted MCP clients.

    An adopted MCP client is an :class:`~envlink.MCPToolClient`, answering as the
    package's OpenEnv would.

    The hooks (``_step_payload``, ``_parse_result``, ``_parse_state``) are OpenEnv's
    own, copied from the package's OpenEnv, so observations are its
    ``CallToolObservation`` / ``ListToolsObservation`` and tools its ``Tool``. Tool
    calls go over ``POST /mcp`` to the client's own session (OpenEnv's production
    mode, the only mode its MCP clients accept), with envlink's deadline, queueing
    and recovery; ``step()`` stays on the session's socket.
    """

    #: OpenEnv's MCP models (``Tool``, ``CallToolAction``...), set on each adopted class.
    _openenv_mcp: Mapping[str, Any] = {}

    def __init__(self, base_url: str | None = None, *, mode: str | None = None,
                 **options: Any) -> None:
        """Same arguments as :class:`~envlink.EnvClient`; ``mode`` defaults to ``"production"``.

        Raises:
            ValueError: ``mode`` is not ``"production"`` (as OpenEnv's MCP clients).
        """
        mode = "production" if mode is None else mode
        if not isinstance(mode, str) or mode.lower() != "production":
            raise ValueError(f"MCPToolClient only supports 'production' mode, got {mode!r}. "
                             "Use GenericEnvClient for simulation mode.")
        super().__init__(base_url, mode=mode, **options)
        self._tools_cache: list[Any] | None = None

    def _tool(self, payload: Mapping[str, Any]) -> Any:
        tool = self._openenv_mcp["Tool"]
        return tool(name=payload.get("name", ""), description=payload.get("description", ""),
                    input_schema=payload.get("input_schema", payload.get("inputSchema", {})))

    @dispatched
    async def list_tools(self, use_cache: bool = True) -> list[Any]:
        """The environment's tools (OpenEnv ``Tool`` objects), cached after the first call.

        ``[]`` only when the server listed no tools. Where OpenEnv's client returns
        ``[]`` on any failure, a call that could not ask raises: a server without HTTP
        MCP (:class:`~envlink.FeatureUnavailableError`, naming the fix), a JSON-RPC
        error (:class:`~envlink.McpError`, e.g. an environment without MCP), an answer
        that is no tool list, an unreachable server, a deadline, a closed client.

        Args:
            use_cache: return the cached list when there is one (``False``: ask again).

        Raises:
            FeatureUnavailableError, McpError, ProtocolError, ConnectError,
            CallTimeoutError, ClientClosedError and the other errors of
            :meth:`~envlink.EnvClient.mcp_request`.
        """
        if use_cache and self._tools_cache is not None:
            return self._tools_cache
        listed = await self.mcp_list_tools()
        tools = [self._tool(t) for t in listed]
        self._tools_cache = tools
        return tools

    @dispatched
    async def call_tool(self, name: str, /, **kwargs: Any) -> Any:
        """Call a tool by name and return its value (not a step).

        Raises:
            ToolCallError: the tool reported an error.
            McpError: unknown tool, bad arguments (a JSON-RPC error).
            OutcomeUnknownError: the connection was lost after the call was sent.
        """
        return await self.mcp_call_tool(name, kwargs)


# ------------------------------------------------------------------ rebuilding classes


def adopt(client_class: _C, /) -> _C:
    """Turn an OpenEnv client class of an environment package into an envlink client class.

    The result has the package class's name, hooks (``_step_payload``,
    ``_parse_result``, ``_parse_state``), extra methods and models, on
    :class:`~envlink.EnvClient`: typed sync use (plain calls and ``.sync()``),
    ``await``, ``from_env`` / ``from_docker_image``, pools, the TRL adapter, and every
    envlink option (``on_session_lost=``, ``timeout=``...). A subclass of OpenEnv's
    ``MCPToolClient`` keeps ``list_tools`` / ``call_tool`` / ``get_tool`` /
    ``has_tool`` (see :class:`McpToolAdapter`). Extra coroutine methods also block
    when called without ``await`` in plain code, as envlink's own do.

    Example::

        from coding_env import CodingEnv, CodeAction
        CodingEnv = envlink.adopt(CodingEnv)
        with CodingEnv(base_url=url, on_session_lost="auto") as env:
            env.reset()
            env.step(CodeAction(code="print(1)"))

    The same class is returned for the same argument; an envlink client class is
    returned as it is.

    Args:
        client_class: a subclass of OpenEnv's ``EnvClient`` (``openenv.core``).

    Raises:
        TypeError: ``client_class`` is not an OpenEnv client class, or it overrides
            one of OpenEnv's private I/O methods, which envlink replaces.
    """
    if isinstance(client_class, type) and issubclass(client_class, EnvClient):
        return client_class
    if not is_openenv_client(client_class):
        raise TypeError(f"adopt() takes a subclass of OpenEnv's EnvClient (openenv.core), "
                        f"got {client_class!r}")
    with _lock:
        return typing.cast(_C, _convert(client_class, _internals(client_class)))


def _internals(cls: type) -> frozenset[str]:
    """OpenEnv's private I/O members, which a package's class may not override."""
    names: set[str] = set()
    for base in cls.__mro__:
        if _openenv_role(base) is not None:
            names.update(n for n, v in vars(base).items()
                         if n.startswith("_") and n not in HOOKS and n not in _NOT_COPIED
                         and not (n.startswith("__") and n.endswith("__"))
                         and (callable(v) or isinstance(v, (property, classmethod,
                                                              staticmethod))))
    names.add("__setattr__")
    return frozenset(names)


def _convert(cls: type, internals: frozenset[str]) -> type:
    known = _adopted.get(cls)
    if known is not None:
        return known
    role = _openenv_role(cls)
    if role == _ENV_CLIENT:
        return EnvClient
    if role == _GENERIC:
        return GenericEnvClient
    mcp = role in (_MCP_BASE, _MCP_TOOL)
    adopted = _mcp_adapter(cls) if mcp else _rebuild(cls, internals)
    _adopted[cls] = adopted
    return adopted


def _mcp_adapter(cls: type) -> type:
    """envlink's twin of OpenEnv's ``MCPClientBase`` / ``MCPToolClient`` (one per OpenEnv)."""
    module = sys.modules[cls.__module__]
    models = {name: getattr(module, name) for name in
              ("Tool", "CallToolAction", "ListToolsAction", "CallToolObservation")
              if hasattr(module, name)}
    # Its hooks are pure functions of the payload: OpenEnv's own, so are its models.
    namespace: dict[str, Any] = {
        name: vars(base)[name] for base in reversed(cls.__mro__)
        if _openenv_role(base) in (_MCP_BASE, _MCP_TOOL)
        for name in HOOKS if name in vars(base)}
    namespace.update(_openenv_mcp=types.MappingProxyType(models), __module__=__name__,
                     __qualname__=cls.__qualname__, __doc__=McpToolAdapter.__doc__)
    return type(cls.__name__, (McpToolAdapter,), namespace)


def _rebuild(cls: type, internals: frozenset[str]) -> type:
    """The package class ``cls`` with its OpenEnv bases replaced by envlink's."""
    own = vars(cls)
    refused = sorted(n for n in own if n in internals)
    if refused:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} overrides OpenEnv's internal "
            f"{', '.join(refused)}; envlink does this I/O itself and cannot honour the "
            "override. Adopt a class that only implements the hooks (_step_payload, "
            "_parse_result, _parse_state) and public methods")
    bases = tuple(_base(b, internals) for b in own.get("__orig_bases__", cls.__bases__))
    cell = types.CellType()
    namespace: dict[str, Any] = {}
    for name, value in own.items():
        if name in _NOT_COPIED:
            continue
        value = _rebind(value, cell)
        if (not name.startswith("_") and inspect.iscoroutinefunction(value)
                and not hasattr(value, "_envlink_raw")):
            value = dispatched(value)
        namespace[name] = value
    namespace["__envlink_adopted__"] = cls

    def body(ns: dict[str, Any]) -> None:
        ns.update(namespace)

    adopted = types.new_class(cls.__name__, bases, {}, body)
    cell.cell_contents = adopted
    return adopted


def _base(base: Any, internals: frozenset[str]) -> Any:
    """A base of a package class: OpenEnv client classes become envlink's (with their
    type arguments where the envlink class takes them); mixins stay."""
    origin = typing.get_origin(base) or base
    if not is_openenv_client(origin):
        return base
    converted = _convert(origin, internals)
    args = typing.get_args(base)
    if args and len(getattr(converted, "__parameters__", ())) == len(args):
        return converted[args]  # type: ignore[index]
    return converted


def _rebind(value: Any, cell: types.CellType) -> Any:
    """``value`` (a function, or a method wrapper) with zero-argument ``super()`` re-pointed."""
    if isinstance(value, types.FunctionType):
        return _rebind_function(value, cell)
    if isinstance(value, (classmethod, staticmethod)):
        inner = _rebind(value.__func__, cell)
        return value if inner is value.__func__ else type(value)(inner)
    if isinstance(value, property):
        parts = [None if f is None else _rebind(f, cell)
                 for f in (value.fget, value.fset, value.fdel)]
        return property(parts[0], parts[1], parts[2], value.__doc__)
    return value


def _rebind_function(fn: types.FunctionType, cell: types.CellType) -> types.FunctionType:
    code = fn.__code__
    if "__class__" not in code.co_freevars or fn.__closure__ is None:
        return fn
    closure = list(fn.__closure__)
    closure[code.co_freevars.index("__class__")] = cell
    twin = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                              tuple(closure))
    twin.__kwdefaults__ = None if fn.__kwdefaults__ is None else dict(fn.__kwdefaults__)
    functools.update_wrapper(twin, fn, updated=())
    twin.__dict__.update(fn.__dict__)
    del twin.__wrapped__  # type: ignore[attr-defined]  # the twin is no wrapper
    return twin
