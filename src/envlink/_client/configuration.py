"""A client's configuration as one value: :class:`ClientConfig`.

Everything that says how a client behaves (its deadlines, how it connects, retries
and recovers, its limits, what it reports to) is one frozen value, as httpx's
``Timeout`` and ``Limits`` are. ``EnvClient(url, config=...)`` keeps it as it is;
the keyword constructor (OpenEnv's names included) builds one with
:meth:`ClientConfig.from_keywords`, the one place where OpenEnv's aliases are
resolved. Each keyword is declared once, here: :class:`ClientOptions` (envlink's)
and :class:`OpenEnvOptions` (OpenEnv's own names, which ``EnvClient`` also spells
out in its signature); ``from_keywords`` and the clients read those declarations.
A session opened with ``new_session()``, a pool's clients, a Ray shard's and the
training adapters' are built from such a value, never by replaying a constructor's
arguments.

Where the server is (``base_url``, a provider, a Space's token) is not
configuration: it stays an argument of the client.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from envlink._client.capacity import CapacityMode, check_mode
from envlink._config import (
    UNSET,
    ConnectionOptions,
    Timeout,
    TimeoutTypes,
    UnsetType,
    check_count,
)
from envlink._errors import InvalidArgumentError
from envlink._fleet.settings import FleetLimits
from envlink._sansio.policies import ReconnectPolicy, RecoveryPolicy, SessionLostPolicy
from envlink._sansio.replay import ReplayVerify
from envlink._sansio.session_limits import Limits
from envlink._transports.choice import TRANSPORT_NAMES, TransportName

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # typing_extensions comes with pydantic
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from envlink._events.client_events import ClientHook, Recorder
    from envlink._transports.base import Transport

__all__ = [
    "CLIENT_OPTIONS",
    "COMMON_OPTIONS",
    "CONFIG_KEYWORDS",
    "OPENENV_OPTIONS",
    "ClientConfig",
    "ClientOptions",
    "CommonOptions",
    "ConfigKeywords",
    "OpenEnvOptions",
    "ReplayVerify",
    "changed_fields",
    "check_keywords",
    "check_policy",
    "config_from_options",
]

#: OpenEnv 0.10's communication modes: Gym-style calls on the WebSocket, or
#: "production", where MCP tool calls go over ``POST /mcp`` with the session's id.
CLIENT_MODES = ("simulation", "production")


def client_mode(mode: str | None, default: str | None = None) -> str:
    """``mode=``, else the client class's ``default`` (``"production"`` for MCP clients,
    which, as OpenEnv's, do not read the variable), else ``OPENENV_CLIENT_MODE``, else
    ``"simulation"`` (case-insensitive).

    Raises:
        ValueError: not ``simulation`` or ``production``.
    """
    if mode is None and default is not None:
        mode = default
    raw = os.environ.get("OPENENV_CLIENT_MODE", "simulation") if mode is None else mode
    if not isinstance(raw, str) or raw.lower() not in CLIENT_MODES:
        raise ValueError(f"mode must be 'simulation' or 'production' (the mode= argument "
                         f"or OPENENV_CLIENT_MODE), got {raw!r}")
    return raw.lower()


#: Fields that hold objects of the process that made the config: never pickled.
_PROCESS_BOUND = ("tracer_provider", "meter_provider")


def check_policy(policy: object) -> RecoveryPolicy:
    """Validate ``on_session_lost``.

    Raises:
        ValueError: not one of the recovery policies.
    """
    try:
        return RecoveryPolicy(policy)
    except ValueError:
        *others, last = (repr(p.value) for p in RecoveryPolicy)
        raise ValueError(f"on_session_lost must be {', '.join(others)} or {last}, "
                         f"got {policy!r}") from None


class CommonOptions(TypedDict, total=False):
    """The keywords of every envlink client, the harness client's too (it takes these
    alone): deadlines, handshake headers, transport and observers. Declared once,
    here; :class:`ClientOptions` adds the rest of :class:`~envlink.EnvClient`'s."""

    timeout: TimeoutTypes | UnsetType
    headers: Mapping[str, str] | None
    transport: Transport | TransportName | None
    hooks: Sequence[ClientHook] | None
    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None


class ClientOptions(CommonOptions, total=False):
    """envlink's configuration keywords of :class:`~envlink.EnvClient`, declared once.

    ``EnvClient(url, **options)`` takes them (``**options: Unpack[ClientOptions]``,
    read by type checkers and IDEs), :meth:`ClientConfig.from_keywords` builds a
    config of them, and a pool's ``client_options`` is a mapping of them. A keyword
    left out takes its default, documented in ``EnvClient``'s docstring; adding an
    option means adding it here, then reading it in :meth:`ClientConfig.from_keywords`
    (a field of :class:`ClientConfig` given as it is needs nothing more). OpenEnv's
    own names are in :class:`OpenEnvOptions`; :class:`CommonOptions` holds the
    keywords the harness client shares.
    """

    reconnect: ReconnectPolicy | None
    on_session_lost: SessionLostPolicy
    replay_verify: ReplayVerify | None
    max_journal_steps: int
    ping_interval: float | None
    ping_timeout: float | None
    max_message_size: int
    compression: str | None
    ssl: Any
    proxy: str | bool | None
    extensions: bool
    options: ConnectionOptions | None
    limits: Limits | None
    on_capacity: CapacityMode
    recorder: Recorder | None
    fleet: FleetLimits | None


class OpenEnvOptions(TypedDict, total=False):
    """OpenEnv 0.10's own configuration keywords of its ``EnvClient``: its aliases
    (resolved by :meth:`ClientConfig.from_keywords`, and only there) and ``mode``.

    ``EnvClient.__init__`` names them in its signature, as OpenEnv's does; a test
    keeps the two alike.
    """

    connect_timeout_s: float | None
    message_timeout_s: float | None
    max_message_size_mb: float | None
    websocket_ping_interval_s: float | UnsetType | None
    websocket_ping_timeout_s: float | UnsetType | None
    mode: str | None


class ConfigKeywords(ClientOptions, OpenEnvOptions, total=False):
    """Every keyword :meth:`ClientConfig.from_keywords` takes: envlink's and OpenEnv's."""


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How a client behaves, as one frozen value: ``EnvClient(url, config=cfg)``.

    Two clients with equal configs behave alike; ``client.config`` is the value the
    client runs with (its ``reconnect_policy`` and ``on_session_lost`` setters
    replace it). Assigning a field raises; build another with
    ``dataclasses.replace(cfg, ...)``. The keyword constructor builds one with
    :meth:`from_keywords`.

    Picklable (``pickle.loads(pickle.dumps(cfg)) == cfg``) when its parts are:
    timeouts, connection options without an ``ssl`` context, policies and limits
    always are; ``replay_verify``, ``hooks`` and ``transport`` are the user's
    objects and pickle as those do (a module-level function does, a lambda only
    with cloudpickle, as Ray uses); a config with ``tracer_provider`` or
    ``meter_provider`` refuses to be pickled, as providers belong to their process.
    ``hooks`` and ``transport`` compare by identity unless their classes say
    otherwise, and a ``RetryBudget`` is not compared (as in ``ReconnectPolicy``).
    Its ``repr`` never shows a header's value, but a pickled config carries the
    headers (``Authorization``...): treat it as a credential. A Space's token
    (``token=``) is the client's, never in its config.

    Attributes:
        timeout: the deadlines of each phase (:class:`~envlink.Timeout`).
        options: how each connection is opened and kept (:class:`~envlink.ConnectionOptions`).
        reconnect: backoff, attempts and retry budget of every retry
            (:class:`~envlink.ReconnectPolicy`).
        on_session_lost: ``"raise"`` (default), ``"replay"``, ``"resume"`` or
            ``"auto"`` (resume when the server can, else replay).
        replay_verify: compares a recorded answer with the replayed one during
            ``replay`` (default: equality of the whole ``data`` object).
        max_journal_steps: bound on the steps recorded for ``replay``.
        extensions: offer envlink's protocol extensions to the server.
        mode: OpenEnv's ``"simulation"`` or ``"production"``; ``None`` (default):
            ``OPENENV_CLIENT_MODE`` when the client is made, else ``"simulation"``.
        limits: sessions per endpoint shared by the process's clients (``None``:
            the process-wide :func:`~envlink.set_limits`).
        on_capacity: ``"raise"`` (default) or ``"wait"`` when the endpoint is full.
        hooks: observers of the client (:class:`~envlink.ClientHook`); ``None``
            (default): envlink's OpenTelemetry and structlog emitter. Given, they
            replace it.
        tracer_provider: the emitter's tracer provider (default: the global one).
        meter_provider: the emitter's meter provider (default: the global one).
        transport: how connections are opened: ``"websockets"``, ``"picows"`` (the
            ``fast`` extra), ``"auto"`` (picows when installed, else websockets;
            ``ENVLINK_TRANSPORT`` says which), or a transport object such as a
            :class:`~envlink.MockTransport` to test code without a server. ``None``
            (default): ``"auto"``.
        recorder: a :class:`~envlink.RolloutRecorder` that records every episode of
            the client (``docs/recording.md``); pickles as its settings.
        fleet: a :class:`~envlink.FleetLimits`: session, start and open-rate limits
            shared with every process that names the same store (``docs/fleet.md``).
            A session waits for its slot in arrival order, within the call's deadline;
            a ``CAPACITY_REACHED`` lowers the endpoint's shared limit and is retried.

    Raises:
        TypeError: a part of the wrong type.
        ValueError: a policy, mode or count out of its range.
    """

    timeout: Timeout = field(default_factory=Timeout)
    options: ConnectionOptions = field(default_factory=ConnectionOptions)
    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    on_session_lost: SessionLostPolicy = "raise"
    replay_verify: ReplayVerify | None = None
    max_journal_steps: int = 10_000
    extensions: bool = True
    mode: str | None = None
    limits: Limits | None = None
    on_capacity: CapacityMode = "raise"
    hooks: tuple[ClientHook, ...] | None = None
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    transport: Transport | TransportName | None = None
    recorder: Recorder | None = None
    fleet: FleetLimits | None = None

    def __post_init__(self) -> None:
        policy = check_policy(self.on_session_lost)
        object.__setattr__(self, "on_session_lost", policy.value)
        if self.mode is not None:
            client_mode(self.mode)
        _check_type(self.timeout, Timeout, "timeout")
        _check_type(self.options, ConnectionOptions, "options")
        _check_type(self.reconnect, ReconnectPolicy, "reconnect")
        if self.replay_verify is not None and not callable(self.replay_verify):
            raise TypeError(f"replay_verify must be callable or None, "
                            f"got {type(self.replay_verify).__name__}")
        object.__setattr__(self, "max_journal_steps",
                           check_count(self.max_journal_steps, "max_journal_steps"))
        if self.limits is not None and not isinstance(self.limits, Limits):
            raise TypeError(f"limits must be an envlink.Limits or None, "
                            f"got {type(self.limits).__name__}")
        check_mode(self.on_capacity)
        if isinstance(self.transport, str) and self.transport not in TRANSPORT_NAMES:
            raise InvalidArgumentError(f"transport must be one of {', '.join(TRANSPORT_NAMES)} "
                                       f"or a Transport, got {self.transport!r}")
        if self.hooks is not None:
            if isinstance(self.hooks, (str, bytes, Mapping)) or not isinstance(
                    self.hooks, Sequence):
                raise TypeError(f"hooks must be a sequence of ClientHook or None, "
                                f"got {type(self.hooks).__name__}")
            object.__setattr__(self, "hooks", tuple(self.hooks))
        if self.fleet is not None and not isinstance(self.fleet, FleetLimits):
            raise TypeError(f"fleet must be an envlink.FleetLimits or None, "
                            f"got {type(self.fleet).__name__}")
        if self.recorder is not None and not callable(getattr(self.recorder, "tape", None)):
            raise TypeError(f"recorder must be an envlink.RolloutRecorder or None, "
                            f"got {type(self.recorder).__name__}")

    def __reduce__(self) -> tuple[type[ClientConfig], tuple[Any, ...]]:
        bound = [name for name in _PROCESS_BOUND if getattr(self, name) is not None]
        if bound:
            raise TypeError(
                f"a ClientConfig with {' and '.join(bound)} cannot be pickled: providers "
                "belong to their process; leave them out and give them where the config "
                "is used (a pool's tracer_provider=, a Ray shard's ShardTelemetry)")
        return (ClientConfig, tuple(getattr(self, f.name) for f in dataclasses.fields(self)))

    def __repr__(self) -> str:
        # Only what differs from the defaults: a config is read in logs and errors.
        shown = [f"{name}={getattr(self, name)!r}" for name in changed_fields(self)]
        return f"ClientConfig({', '.join(shown)})"

    @classmethod
    def from_keywords(cls, **keywords: Unpack[ConfigKeywords]) -> ClientConfig:
        """The config of ``EnvClient``'s keyword arguments, OpenEnv's names included.

        The keywords are those declared in :class:`ClientOptions` and
        :class:`OpenEnvOptions`, with ``EnvClient``'s defaults. This is where
        OpenEnv's aliases are resolved, and only here: ``connect_timeout_s`` and
        ``message_timeout_s`` set ``Timeout``'s ``connect`` and ``call``;
        ``max_message_size_mb`` sets ``max_message_size``;
        ``websocket_ping_interval_s`` and ``websocket_ping_timeout_s`` set
        ``ping_interval`` and ``ping_timeout``. The connection keywords
        (``headers``, ``ping_interval``, ... ``proxy``) build the
        :class:`~envlink.ConnectionOptions`, or ``options=`` gives it whole.

        Args:
            timeout: a :class:`~envlink.Timeout`, a number for every phase, or
                ``None`` for none.
            options: every connection option at once, instead of ``headers``,
                ``ping_interval``, ... (which must then be left out).
            **others: as :class:`EnvClient` and the attributes of this class.

        Raises:
            ValueError: ``options`` with connection keywords, or a bad value.
            TypeError: a keyword that is not one of them, or a value of the wrong type.
        """
        if not CONFIG_KEYWORDS.issuperset(keywords):
            check_keywords(keywords, CONFIG_KEYWORDS, "ClientConfig.from_keywords()")
        return _resolve(cls, keywords)


def _resolve(cls: type[ClientConfig], keywords: ConfigKeywords) -> ClientConfig:
    # The body of from_keywords, its keywords checked.
    recovery = check_policy(keywords.get("on_session_lost", _DEFAULTS.on_session_lost))  # first
    timeout = keywords.get("timeout", UNSET)
    # Immutable defaults are shared between clients: fewer objects per session.
    base = _DEFAULTS.timeout if timeout is UNSET else Timeout.coerce(timeout)
    connect_timeout_s = keywords.get("connect_timeout_s")
    message_timeout_s = keywords.get("message_timeout_s")
    if connect_timeout_s is not None or message_timeout_s is not None:
        base = Timeout(
            connect=connect_timeout_s if connect_timeout_s is not None else base.connect,
            call=message_timeout_s if message_timeout_s is not None else base.call,
            close=base.close, probe=base.probe, release=base.release)
    reconnect = keywords.get("reconnect")
    if reconnect is not None and not isinstance(reconnect, ReconnectPolicy):
        raise TypeError(f"reconnect must be a ReconnectPolicy or None, "
                        f"got {type(reconnect).__name__}")
    options = keywords.get("options")
    max_message_size_mb = keywords.get("max_message_size_mb")
    websocket_ping_interval_s = keywords.get("websocket_ping_interval_s", UNSET)
    websocket_ping_timeout_s = keywords.get("websocket_ping_timeout_s", UNSET)
    if (_CONNECTION_KEYWORDS.isdisjoint(keywords) and max_message_size_mb is None
            and websocket_ping_interval_s is UNSET and websocket_ping_timeout_s is UNSET):
        # No connection keyword (the common case): the defaults, or options= as given.
        built = _DEFAULTS.options if options is None else options
    else:
        # A keyword left out keeps ConnectionOptions' default.
        default = _DEFAULTS.options
        max_message_size = keywords.get("max_message_size", default.max_message_size)
        if max_message_size_mb is not None:
            max_message_size = int(max_message_size_mb * 1024 * 1024)
        ping_interval = keywords.get("ping_interval", default.ping_interval)
        if websocket_ping_interval_s is not UNSET:
            ping_interval = websocket_ping_interval_s
        ping_timeout = keywords.get("ping_timeout", default.ping_timeout)
        if websocket_ping_timeout_s is not UNSET:
            ping_timeout = websocket_ping_timeout_s
        built = ConnectionOptions(
            headers=tuple((keywords.get("headers") or {}).items()), ping_interval=ping_interval,
            ping_timeout=ping_timeout, max_message_size=max_message_size,
            compression=keywords.get("compression", default.compression),
            ssl=keywords.get("ssl", default.ssl), proxy=keywords.get("proxy", default.proxy))
        if options is not None:
            if built != _DEFAULTS.options:
                raise ValueError("pass connection options either as options= or as keyword "
                                 "arguments (headers, ping_interval, ...), not both")
            built = options
        elif built == _DEFAULTS.options:
            built = _DEFAULTS.options
    hooks = keywords.get("hooks")
    # The keywords that are fields of the config as they are; a field left out keeps
    # its default, declared in ClientConfig.
    same: dict[str, Any] = {name: value for name, value in keywords.items() if name in _AS_FIELDS}
    return cls(
        timeout=base, options=built,
        reconnect=reconnect if reconnect is not None else _DEFAULTS.reconnect,
        on_session_lost=recovery.value, hooks=None if hooks is None else tuple(hooks),
        **same)


def check_keywords(given: Iterable[str], known: frozenset[str], where: str) -> None:
    """Raise as Python does for a keyword argument ``where`` does not take.

    Raises:
        TypeError: a name of ``given`` is not in ``known`` (the first one is named,
            with the closest known name when one is close).
    """
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{where} got an unexpected keyword argument {name!r}{hint}")


def changed_fields(config: ClientConfig) -> list[str]:
    """The names of the fields of ``config`` that differ from the defaults."""
    return [f.name for f in dataclasses.fields(config)
            if getattr(config, f.name) != getattr(_DEFAULTS, f.name)]


def _check_type(value: object, kind: type, name: str) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")


#: The defaults, for comparisons (what a keyword left out leaves).
_DEFAULTS = ClientConfig()
#: The names of the declarations, read once: envlink's keywords, OpenEnv's, and all
#: that :meth:`ClientConfig.from_keywords` takes; the harness client's.
COMMON_OPTIONS: frozenset[str] = frozenset(CommonOptions.__optional_keys__)
CLIENT_OPTIONS: frozenset[str] = frozenset(ClientOptions.__optional_keys__)
OPENENV_OPTIONS: frozenset[str] = frozenset(OpenEnvOptions.__optional_keys__)
CONFIG_KEYWORDS: frozenset[str] = frozenset(ConfigKeywords.__optional_keys__)
#: envlink's keywords that build the ConnectionOptions (OpenEnv's aliases aside).
_CONNECTION_KEYWORDS: frozenset[str] = frozenset({
    "headers", "ping_interval", "ping_timeout", "max_message_size", "compression", "ssl",
    "proxy"})
#: The keywords that are fields of ClientConfig as they are (the others are resolved).
_AS_FIELDS: frozenset[str] = (
    CONFIG_KEYWORDS & {f.name for f in dataclasses.fields(ClientConfig)}
) - {"timeout", "options", "reconnect", "on_session_lost", "hooks"}


def config_from_options(options: Mapping[str, Any], name: str = "client_options"
                        ) -> ClientConfig:
    """The config of a mapping of client keyword arguments (the deprecated
    ``client_options`` of the pools and the training adapters), made once.

    Raises:
        TypeError: ``options`` is not a mapping, or has a key that is not client
            configuration (an argument of a client class of one's own, ``provider``,
            ``token``...).
        ValueError: as :meth:`ClientConfig.from_keywords`.
    """
    if not isinstance(options, Mapping):
        raise TypeError(f"{name} must be a mapping, got {type(options).__name__}")
    unknown = sorted(set(options) - CONFIG_KEYWORDS)
    if unknown:
        raise TypeError(
            f"{name} has keys that are not client configuration: {', '.join(unknown)}; "
            f"for arguments of your own client class, pass a factory such as "
            f"functools.partial(YourClient, ...)")
    return ClientConfig.from_keywords(**options)
