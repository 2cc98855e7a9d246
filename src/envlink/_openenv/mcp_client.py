"""MCP tool clients with OpenEnv 0.10's surface: :class:`MCPClientBase`, :class:`MCPToolClient`.

As in OpenEnv, an MCP client is in *production* mode unless ``mode=`` says
otherwise (``OPENENV_CLIENT_MODE`` is not read, as OpenEnv does not read it for MCP
clients): ``list_tools()`` and ``call_tool()`` go over ``POST /mcp`` to the
session's own environment, so a tool call is not a step. Unlike OpenEnv, which
cannot work at all against a server without HTTP MCP sessions, a client left on
the default mode then calls tools with ``step()``, as in simulation mode, and so it
does on a server that answers tool calls over ``POST /mcp`` "method not found". An
explicit ``mode="production"`` goes over ``POST /mcp`` all the same (envlink's
reference server answers there in every mode); a server with no session to run them
on raises :class:`~envlink.FeatureUnavailableError`.

``list_tools()`` returns :class:`Tool` objects (``.name``, ``.description``,
``.input_schema``), cached as OpenEnv caches them. As OpenEnv's ``_parse_result``
does, a step's observation is a :class:`CallToolObservation` when it names a
``tool_name`` (after a ``call_tool`` step; a tool error is a :class:`ToolError`,
``.error_type`` and ``.message``) and a :class:`ListToolsObservation` when it
lists ``tools``; both are :class:`MCPObservation` objects, readable by key.

One rule for every type envlink mirrors from OpenEnv and returns (the MCP
observations, :class:`Tool`, :class:`ToolError`, :class:`~envlink.State`): where
``openenv`` is importable, the object is built as a class that is both envlink's and
OpenEnv's of the same name (:func:`mirrored`, made once; OpenEnv's models are imported
on an MCP client's creation), so ``isinstance`` against either holds, and an enum's
members are OpenEnv's own (``error.error_type is ToolErrorType.TOOL_NOT_FOUND`` with
OpenEnv's ``ToolErrorType``; equal to envlink's). Without ``openenv``, envlink's
classes and members stand alone.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Iterator
from enum import Enum, EnumMeta
from typing import Annotated, Any, ClassVar, Literal, TypeVar, cast

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    PlainSerializer,
    PlainValidator,
    field_validator,
)

from envlink._bridge.dispatch import dispatched
from envlink._client.client import EnvClient, StepResult
from envlink._errors import McpError, ToolCallError
from envlink._sansio import jsonrpc
from envlink._sansio.state import State

__all__ = ["CallToolAction", "CallToolObservation", "ListToolsAction",
           "ListToolsObservation", "MCPClientBase", "MCPObservation", "MCPToolClient", "Tool",
           "ToolError", "ToolErrorType", "mirrored", "openenv_mirrors"]


_METHOD_NOT_FOUND = -32601
#: An answer saying the call goes through ``step()`` instead.
_ON_STEP: Any = object()


class _ReadableByKey(BaseModel):
    """A model also readable as the dict it replaces (``tool["name"]``, ``.get()``):
    code written when these were plain dicts keeps working."""

    _aliases: ClassVar[dict[str, str]] = {}

    def __getitem__(self, key: str) -> Any:
        data = self.model_dump(mode="json")
        return data[self._aliases.get(key, key)]

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default``."""
        data = self.model_dump(mode="json")
        return data.get(self._aliases.get(key, key), default)

    def keys(self) -> Iterator[str]:
        """The field names (so that ``dict(**tool)`` works as it did for a dict)."""
        return iter(self.model_dump(mode="json"))


class Tool(_ReadableByKey):
    """An MCP tool, as OpenEnv's ``Tool``: its name, description and input JSON Schema.

    The MCP spelling ``inputSchema`` is accepted when building one from a payload
    (``Tool.model_validate``, :meth:`from_payload`) and when reading it by key.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    _aliases: ClassVar[dict[str, str]] = {"inputSchema": "input_schema"}

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(
        default_factory=dict, validation_alias=AliasChoices("input_schema", "inputSchema"))

    @classmethod
    def from_payload(cls, payload: Any) -> Tool:
        """A tool from a server's tool object (``input_schema`` or ``inputSchema``)."""
        if isinstance(payload, Tool):
            return payload
        if not isinstance(payload, dict):
            raise TypeError(f"a tool must be an object, got {type(payload).__name__}")
        schema = payload.get("input_schema", payload.get("inputSchema"))
        return mirrored(cls)(name=payload.get("name", ""),
                   description=payload.get("description") or "",
                   input_schema=schema if isinstance(schema, dict) else {})


class ToolErrorType(str, Enum):
    """The kind of a tool error, as OpenEnv's ``ToolErrorType``. A kind the server
    names that is not listed here is kept as it was sent (``.value``)."""

    EXECUTION_ERROR = "execution_error"
    INVALID_ARGS = "invalid_args"
    TRANSPORT_ERROR = "transport_error"
    TOOL_NOT_FOUND = "tool_not_found"
    TIMEOUT = "timeout"

    @classmethod
    def _missing_(cls, value: object) -> ToolErrorType | None:
        if not isinstance(value, str):
            return None
        # Another server's kind: a member made for it, with its own value.
        member = str.__new__(cls, value)
        member._name_ = value.upper()
        member._value_ = value
        return member


def _error_kind(value: Any) -> Any:
    """A tool error's kind: OpenEnv's member where ``openenv`` is importable and names
    it, else envlink's (another server's kind kept with its value)."""
    raw = value.value if isinstance(value, Enum) else value
    if not isinstance(raw, str):
        raise ValueError(f"a tool error's type must be a string, got {type(raw).__name__}")
    theirs = openenv_mirrors()
    if theirs is not None:
        try:
            return theirs(raw)
        except ValueError:
            pass  # a kind OpenEnv does not list
    return ToolErrorType(raw)


def _kind_in() -> PlainValidator:
    # json_schema_input_type (its schema named, not "any") is pydantic 2.10's; the
    # declared floor (2.6) validates the same without it.
    try:
        return PlainValidator(_error_kind, json_schema_input_type=ToolErrorType)
    except TypeError:
        return PlainValidator(_error_kind)


def _kind_out(value: Any, info: FieldSerializationInfo) -> Any:
    return value.value if info.mode_is_json() and isinstance(value, Enum) else value


class ToolError(_ReadableByKey):
    """A tool call's error in a step's observation, as OpenEnv's ``ToolError``.

    ``error_type``'s members are OpenEnv's ``ToolErrorType``'s where ``openenv`` is
    importable (see the module), else :class:`ToolErrorType`'s; they compare equal.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    error_type: Annotated[
        ToolErrorType, _kind_in(),
        PlainSerializer(_kind_out, return_type=str),
    ] = Field(default=ToolErrorType.EXECUTION_ERROR, validate_default=True)
    message: str = ""


class CallToolAction(BaseModel):
    """Call an MCP-style tool: ``{"type": "call_tool", "tool_name": ..., "arguments": {...}}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ListToolsAction(BaseModel):
    """List the environment's MCP-style tools: ``{"type": "list_tools"}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["list_tools"] = "list_tools"


class MCPObservation(BaseModel):
    """An observation of an MCP environment.

    ``tools`` (after a ``list_tools`` step) are :class:`Tool` objects; ``error``
    (after a failed ``call_tool`` step) is a :class:`ToolError`. Whatever else the
    server sends is kept and readable as an attribute or by key (``obs["result"]``).
    """

    model_config = ConfigDict(extra="allow")

    tool_name: str | None = None
    result: Any = None
    error: ToolError | None = None
    tools: list[Tool] | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _tools(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [Tool.from_payload(item) for item in value]
        return value

    @field_validator("error", mode="before")
    @classmethod
    def _error(cls, value: Any) -> Any:
        if value is None or value == "" or isinstance(value, ToolError):
            return value or None
        if isinstance(value, dict):
            return mirrored(ToolError).model_validate(value)
        # A server that sends the error as text.
        return mirrored(ToolError)(message=str(value))

    def __getitem__(self, key: str) -> Any:
        # That field alone, dumped as model_dump() would (a tool as a dict): a key read
        # never dumps the whole observation.
        data = self.model_dump(include={key})
        return data[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default``."""
        return self.model_dump(include={key}).get(key, default)


class CallToolObservation(MCPObservation):
    """A ``call_tool`` step's observation, as OpenEnv's ``CallToolObservation``.

    ``tool_name``, the tool's ``result`` (``None`` when it failed) and ``error``, a
    :class:`ToolError` (``.error_type``, a :class:`ToolErrorType`, and ``.message``)
    or ``None``; ``done``, ``reward`` and ``metadata`` are the step's, as on
    OpenEnv's observation. An :class:`MCPObservation`: readable by key
    (``obs["result"]``), and whatever else the server sends is kept.
    """

    tool_name: str
    done: bool = False
    reward: bool | int | float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class ListToolsObservation(MCPObservation):
    """A ``list_tools`` step's observation, as OpenEnv's ``ListToolsObservation``.

    ``tools`` are :class:`Tool` objects (a server's ``input_schema`` or MCP's
    ``inputSchema``); ``done``, ``reward`` and ``metadata`` are the step's. An
    :class:`MCPObservation`: readable by key, whatever else the server sends kept.
    """

    tools: list[Tool] = Field(default_factory=list)
    done: bool = False
    reward: bool | int | float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def _restore_observation(kind: type[MCPObservation], base: type[MCPObservation],
                         state: Any) -> MCPObservation:
    """Unpickles an observation of a class made by :func:`_observation_class`."""
    cls = mirrored(_observation_class(kind, base))
    observation = cls.__new__(cls)
    observation.__setstate__(state)
    return observation


@functools.cache
def _observation_class(kind: type[MCPObservation],
                       base: type[MCPObservation]) -> type[MCPObservation]:
    """The class of a tool step's observation (``kind``, :class:`CallToolObservation` or
    :class:`ListToolsObservation`) for a client whose observations are ``base``.

    ``kind`` itself for :class:`MCPObservation`; for a client's own subclass (such as
    ``EchoObservation``), a class that is both, made once, so that an observation is an
    instance of what OpenEnv's code and what the client's code check for.
    """
    if base is MCPObservation or issubclass(kind, base):
        return kind
    if issubclass(base, kind):
        return base
    if issubclass(base, CallToolObservation | ListToolsObservation):
        return kind  # the other kind's class: its required fields would not fit

    def __reduce__(self: MCPObservation) -> tuple[Any, ...]:
        return _restore_observation, (kind, base, self.__getstate__())

    return cast(type[MCPObservation], type(base.__name__, (kind, base), {
        "__module__": base.__module__, "__qualname__": base.__qualname__,
        "__doc__": base.__doc__, "__reduce__": __reduce__}))


_ObsT = TypeVar("_ObsT", bound=MCPObservation)


class MCPClientBase(EnvClient[Any, _ObsT, State]):
    """Base of MCP clients, as OpenEnv 0.10's: tool discovery with a cache.

    Takes :class:`~envlink.EnvClient`'s arguments. ``mode`` defaults to
    ``"production"`` (see the module). Actions may be :class:`CallToolAction`,
    :class:`ListToolsAction`, other pydantic models or dicts; observations are
    :class:`MCPObservation` (a subclass sets ``_observation_type``): as OpenEnv's,
    a :class:`CallToolObservation` when the server's observation names a
    ``tool_name`` and a :class:`ListToolsObservation` when it lists ``tools`` (also
    an instance of the subclass's ``_observation_type``); ``state()`` is a
    :class:`~envlink.State`.
    """

    _default_mode: ClassVar[str | None] = "production"
    #: The observation model :meth:`_parse_result` builds.
    _observation_type: ClassVar[type[MCPObservation]] = MCPObservation
    #: The tools of the last ``list_tools()`` that reached the server.
    _tools_cache: list[Tool] | None = None
    #: Set when the server, on the default mode, answered tool calls over ``POST /mcp``
    #: "method not found" (envlink's reference server): they go through ``step()``.
    _tools_on_step: bool = False

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[_ObsT]:
        observation = payload.get("observation")
        if not isinstance(observation, dict):
            observation = {}
        reward = payload.get("reward")
        done = bool(payload.get("done", False))
        metadata = payload.get("metadata")
        # As OpenEnv's MCP client: a tool listing, a tool call, or the client's own type.
        if isinstance(observation.get("tools"), list):
            kind: type[MCPObservation] = ListToolsObservation
        elif isinstance(observation.get("tool_name"), str):
            kind = CallToolObservation
        else:
            return StepResult(
                observation=cast(_ObsT, mirrored(self._observation_type)
                                 .model_validate(observation)),
                reward=reward, done=done, metadata=metadata)
        fields = {**observation, "done": done, "reward": reward,
                  "metadata": metadata or observation.get("metadata") or {}}
        return StepResult(
            observation=cast(_ObsT, mirrored(_observation_class(kind, self._observation_type))
                             .model_validate(fields)),
            reward=reward, done=done, metadata=metadata)

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return mirrored(State).model_validate(payload)

    def __init__(self, base_url: str | None = None, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        # What this client returns is also an instance of OpenEnv's classes (see the
        # module): their models imported now, not on the loop at the first answer.
        _openenv()

    @property
    def use_production_mode(self) -> bool:
        """Whether tool calls go over ``POST /mcp`` (production mode), as OpenEnv's
        attribute of that name; ``True`` when the client is in production mode.

        Settable, as in OpenEnv: ``False`` runs ``list_tools()`` and ``call_tool()`` as
        steps (what OpenEnv's ``MCPToolClient``, which refuses ``mode="simulation"``,
        offers instead), ``True`` sends them over ``POST /mcp``; from the next call,
        and the next connection for the session it opens. ``mode`` stays as created.

        Raises:
            TypeError: set to something else than a bool.
        """
        return self._production

    @use_production_mode.setter
    def use_production_mode(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"use_production_mode must be a bool, got {type(value).__name__}")
        self._production = value
        self._core.set_production(value)

    async def _tools_over_http(self) -> bool:
        """Whether tool calls go over ``POST /mcp`` (production mode on a server that
        offers HTTP MCP sessions and answers tool calls there), not through ``step()``."""
        if not self._production:
            return False
        if self.config.mode is not None:
            return True  # asked for: a server without HTTP MCP sessions is an error
        if self._tools_on_step:
            return False
        core = self._core
        if core.detached_offered is None:
            await self.connect()  # learns whether the server offers them
        return core.detached_offered is True

    async def _over_http(self, method: str, params: dict[str, Any]) -> Any:
        """``method`` over ``POST /mcp``; :data:`_ON_STEP` when a server left on the default
        mode does not know it there (its answer proves it did not run it)."""
        try:
            return await self.mcp_request(method, params)
        except McpError as exc:
            if exc.rpc_code != _METHOD_NOT_FOUND or self.config.mode is not None:
                raise
            self._tools_on_step = True
            return _ON_STEP

    @dispatched
    async def list_tools(self, use_cache: bool = True) -> list[Tool]:
        """The environment's tools, as :class:`Tool` objects (``name``, ``description``,
        ``input_schema``).

        Args:
            use_cache: return the tools of the last call that reached the server, if
                any (OpenEnv's cache); ``False`` asks the server again.

        Raises:
            McpError, ServerError, ConnectError, CallTimeoutError and the errors of
            ``step()`` / ``mcp_list_tools()`` (where OpenEnv's production mode returns
            ``[]`` on any failure, envlink raises a typed error).
        """
        if use_cache and self._tools_cache is not None:
            return self._tools_cache
        answer = _ON_STEP
        if await self._tools_over_http():
            answer = await self._over_http("tools/list", {})
        if answer is not _ON_STEP:
            tools = [Tool.from_payload(t) for t in jsonrpc.tool_list(answer)]
        else:
            result = await self.step(ListToolsAction())
            listed = getattr(result.observation, "tools", None)
            tools = list(listed) if isinstance(listed, list) else []
        self._tools_cache = tools
        return tools

    @dispatched
    async def get_tool(self, name: str) -> Tool | None:
        """The tool named ``name`` (from :meth:`list_tools`, cached), or ``None``."""
        for tool in await self.list_tools():
            if tool.name == name:
                return tool
        return None

    @dispatched
    async def has_tool(self, name: str) -> bool:
        """Whether the environment has a tool named ``name`` (see :meth:`get_tool`)."""
        return await self.get_tool(name) is not None


class MCPToolClient(MCPClientBase[_ObsT]):
    """Client of an MCP tool-calling environment, as OpenEnv 0.10's ``MCPToolClient``.

    Example::

        with MCPToolClient("http://127.0.0.1:8000") as env:
            env.reset()
            print([tool.name for tool in env.list_tools()])
            print(env.call_tool("echo_message", message="hi"))
    """

    @dispatched
    async def call_tool(self, name: str, /, **kwargs: Any) -> Any:
        """Call the tool ``name`` with ``kwargs`` and return its value.

        In production mode the call goes over ``POST /mcp`` and is not a step;
        otherwise it is a ``call_tool`` step. A FastMCP result (``content`` and
        ``data``) is unwrapped to its ``data``, as OpenEnv's client does.

        Raises:
            ToolCallError: the tool call failed (unknown tool, invalid arguments...);
                a ``RuntimeError`` too, as OpenEnv raises.
            McpError: a JSON-RPC error object (production mode).
            and the errors of ``step()`` / ``mcp_call_tool()``.
        """
        if await self._tools_over_http():
            answer = await self._over_http("tools/call", {"name": name, "arguments": kwargs})
            if answer is not _ON_STEP:
                return jsonrpc.tool_value(name, answer)
        result = await self.step(CallToolAction(tool_name=name, arguments=kwargs))
        observation = result.observation
        if not isinstance(observation, MCPObservation):
            return observation
        error = observation.error
        if error is not None:
            # OpenEnv's wording, for code that matches on it.
            raise ToolCallError(f"Tool '{name}' failed: {error.message} "
                                f"(type: {error.error_type.value})", error.error_type.value,
                                tool_name=name)
        value = observation.result
        if isinstance(value, dict) and "data" in value:
            return value["data"]
        return value



#: Where OpenEnv defines the classes envlink mirrors, and their names there.
_MIRRORED = (
    ("openenv.core.env_server.mcp_types",
     ("Tool", "ToolError", "CallToolObservation", "ListToolsObservation")),
    ("openenv.core.env_server.types", ("State",)),
)


@functools.cache
def _openenv() -> tuple[dict[str, type], EnumMeta | None] | None:
    """OpenEnv's classes that envlink mirrors, by name, and its ``ToolErrorType``
    (imported once, on first use); ``None`` without ``openenv``."""
    try:
        if importlib.util.find_spec("openenv") is None:
            return None
        modules = [(importlib.import_module(name), names) for name, names in _MIRRORED]
    except Exception:  # an openenv that does not import: envlink's classes stand alone
        return None
    classes = {name: theirs for module, names in modules for name in names
               if isinstance(theirs := getattr(module, name, None), type)
               and issubclass(theirs, BaseModel)}
    kinds = getattr(modules[0][0], "ToolErrorType", None)
    return classes, kinds if isinstance(kinds, EnumMeta) else None


def openenv_mirrors() -> EnumMeta | None:
    """OpenEnv's ``ToolErrorType`` where ``openenv`` is importable, else ``None`` (the
    rule of the module: envlink's members then, OpenEnv's classes as bases)."""
    found = _openenv()
    return None if found is None else found[1]


_M = TypeVar("_M", bound=BaseModel)


def _restore_mirrored(cls: type[BaseModel], state: Any) -> BaseModel:
    """Unpickles an object of a class made by :func:`mirrored`."""
    made = mirrored(cls)
    obj = made.__new__(made)
    obj.__setstate__(state)
    return obj


def mirrored(cls: type[_M]) -> type[_M]:
    """The class an object of envlink's ``cls`` is built as (see the module): where
    ``openenv`` is importable and ``cls`` (or a base) mirrors one of OpenEnv's classes,
    a class of the same name that is both (envlink's fields, validators and
    configuration first), made once; else ``cls`` itself."""
    return cast(type[_M], _mirror_of(cls))


@functools.cache
def _mirror_of(cls: type[BaseModel]) -> type[BaseModel]:
    found = _openenv()
    if found is None:
        return cls
    from envlink._sansio.state import State as OurState

    ours: dict[type, str] = {Tool: "Tool", ToolError: "ToolError",
                             CallToolObservation: "CallToolObservation",
                             ListToolsObservation: "ListToolsObservation", OurState: "State"}
    name = next((ours[c] for c in cls.__mro__ if c in ours), None)
    theirs = found[0].get(name) if name is not None else None
    if theirs is None or issubclass(cls, theirs):
        return cls

    def __reduce__(self: BaseModel) -> tuple[Any, ...]:
        return _restore_mirrored, (cls, self.__getstate__())

    namespace: dict[str, Any] = {
        "model_config": dict(cls.model_config), "__module__": cls.__module__,
        "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    if "__reduce__" not in vars(cls):  # a made class keeps its own way back (mirrored)
        namespace["__reduce__"] = __reduce__
    return cast(type[BaseModel], type(cls.__name__, (cls, theirs), namespace))
