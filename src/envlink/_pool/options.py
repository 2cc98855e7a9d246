"""The options of a pool, validated once, for :class:`~envlink.EnvPool` and ``RayEnvPool``.

Both pools take the same options and check them the same way: the in-process pool
when it is built, the Ray pool on the driver before any actor starts (each shard
actor then builds its in-process pool from the same object). The checks of each
batch call's mask, actions and deadline are here too, so both pools refuse the
same calls with the same errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from envlink._client.client import EnvClient, GenericEnvClient, configured_client
from envlink._client.configuration import ClientConfig, config_from_options
from envlink._config import UNSET, UnsetType, check_number
from envlink._pool.breaker import CircuitBreaker
from envlink._pool.placement import parse_endpoints
from envlink._sansio.policies import (
    POOL_NO_AUTO,
    POOL_SESSION_LOST_POLICIES,
    PoolSessionLostPolicy,
    ReconnectPolicy,
    SessionLostPolicy,
)
from envlink._sansio.replay import ReplayVerify

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["DEFAULT_CAPACITY_POLICY", "AutoresetMode", "PoolOptions"]

AutoresetMode = Literal["next_step", "same_step", "disabled"]
_AUTORESET = ("next_step", "same_step", "disabled")

#: Waiting for room while every endpoint is full: many short waits, bounded.
DEFAULT_CAPACITY_POLICY = ReconnectPolicy(max_attempts=120, initial_delay=0.05,
                                          max_delay=1.0, max_elapsed=120.0)

ClientSpec = type[EnvClient[Any, Any, Any]] | Callable[[str], EnvClient[Any, Any, Any]]


@dataclass(frozen=True)
class PoolOptions:
    """What a pool is built from, checked when it is made: the arguments of ``EnvPool``
    and ``RayEnvPool``, declared here and nowhere else (both pools take them as
    keyword arguments and pass them here).

    Picklable when its callables and its client config are (Ray sends it to the
    shard actors).

    Attributes:
        client_config: the :class:`~envlink.ClientConfig` of every session's client
            (when ``client`` is a class), given to it exactly, except that the pool
            sets ``on_session_lost`` (which must be left at ``"raise"`` here) and
            fills in the pool's tracer and meter providers where it has none.
        client_options: deprecated, the same as keyword arguments of the client
            (``{"timeout": ...}``), turned into ``client_config`` once here.

    Raises:
        ValueError: a bad endpoint, size, mode or option.
        TypeError: ``client`` is neither an EnvClient class nor a callable, an
            endpoint is not a string, or ``client_options`` has a key that is not
            client configuration.
    """

    endpoints: str | Sequence[str]
    size: int
    client: ClientSpec = GenericEnvClient
    client_config: ClientConfig | None = None
    client_options: InitVar[Mapping[str, Any] | None] = None
    on_session_lost: PoolSessionLostPolicy = "raise"
    autoreset: AutoresetMode = "next_step"
    autoreset_kwargs: Callable[[int, int], Mapping[str, Any]] | None = None
    batch_timeout: float | None = None
    max_inflight: int | None = None
    capacity: ReconnectPolicy | None = None
    breaker_threshold: int = 3
    breaker_reset_timeout: float = 5.0
    replay_verify: ReplayVerify | None = None
    #: ``(url, host, port)`` of each endpoint, in order (from ``endpoints``).
    parsed: tuple[tuple[str, str, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self, client_options: Mapping[str, Any] | None) -> None:
        size = self.size
        check_number(size, "size", integer=True, minimum=1, mistyped=ValueError,
                     expected="a positive integer")
        policy = self.on_session_lost
        if policy not in POOL_SESSION_LOST_POLICIES:
            why = f" ({POOL_NO_AUTO})" if str(policy) == "auto" else ""
            raise ValueError(f"on_session_lost must be one of {POOL_SESSION_LOST_POLICIES}, "
                             f"got {policy!r}{why}")
        if self.autoreset not in _AUTORESET:
            raise ValueError(f"autoreset must be one of {_AUTORESET}, got {self.autoreset!r}")
        check_number(self.batch_timeout, "batch_timeout", above=0, optional=True)
        check_number(self.max_inflight, "max_inflight", integer=True, minimum=1, optional=True,
                     mistyped=ValueError, expected="a positive integer or None")
        object.__setattr__(self, "client_config",
                           _client_config(self.client_config, client_options))
        object.__setattr__(self, "parsed", tuple(parse_endpoints(self.endpoints)))
        _check_client(self.client)
        CircuitBreaker(self.breaker_threshold, self.breaker_reset_timeout)  # its own checks

    @property
    def urls(self) -> tuple[str, ...]:
        """The endpoint URLs, in the order given."""
        return tuple(url for url, _host, _port in self.parsed)

    @property
    def capacity_policy(self) -> ReconnectPolicy:
        """``capacity``, or the default wait for room."""
        return self.capacity or DEFAULT_CAPACITY_POLICY

    def arguments(self) -> dict[str, Any]:
        """These options as the keyword arguments of ``EnvPool`` (which checks them again)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def for_shard(self, size: int) -> PoolOptions:
        """These options for a part of the pool: ``size`` of its slots."""
        return dataclasses.replace(self, endpoints=self.urls, size=size)

    def client_factory(self, tracer_provider: TracerProvider | None,
                       meter_provider: MeterProvider | None
                       ) -> Callable[[str], EnvClient[Any, Any, Any]]:
        """Builds each session's client for a base URL.

        The pool rebuilds lost episodes itself (on any endpoint), so its clients only
        report the loss; ``"resume"`` belongs to the client: it needs the same server.
        """
        policy: SessionLostPolicy = "resume" if self.on_session_lost == "resume" else "raise"
        # Under the pool's replay its clients' journals keep every step (the pool
        # replays them); otherwise they keep none, as their own policy says.
        replays = self.on_session_lost == "replay"
        client = self.client
        if isinstance(client, type):
            cls = client
            config = self.client_config
            if config is None:
                def build_default(url: str) -> EnvClient[Any, Any, Any]:
                    built: EnvClient[Any, Any, Any] = cls(
                        url, on_session_lost=policy, tracer_provider=tracer_provider,
                        meter_provider=meter_provider)
                    built.record_steps = replays
                    return built

                return build_default
            # Worked out once for every client of the pool.
            changes: dict[str, Any] = {}
            if config.on_session_lost != policy:
                changes["on_session_lost"] = policy
            if config.tracer_provider is None and tracer_provider is not None:
                changes["tracer_provider"] = tracer_provider
            if config.meter_provider is None and meter_provider is not None:
                changes["meter_provider"] = meter_provider
            if changes:
                config = dataclasses.replace(config, **changes)
            chosen = config

            def build(url: str) -> EnvClient[Any, Any, Any]:
                built: EnvClient[Any, Any, Any] = configured_client(cls, url, chosen)
                built.record_steps = replays
                return built

            return build

        def build_custom(url: str) -> EnvClient[Any, Any, Any]:
            made = client(url)
            if not isinstance(made, EnvClient):
                raise TypeError(f"the client factory returned {type(made).__name__}, "
                                "not an EnvClient")
            made.on_session_lost = policy
            made.record_steps = replays
            return made

        return build_custom

    def select(self, mask: Sequence[bool] | None, actions: Sequence[Any] | None,
               busy: Callable[[list[int]], list[int]]) -> list[int]:
        """The slots a batch call is for, after checking its ``mask`` and ``actions``.

        Args:
            mask: which slots (``None``: all).
            actions: one action per slot, for a step (``None``: a reset).
            busy: the slots among those given that still have a call in flight.

        Raises:
            ValueError: a wrong length, or a chosen slot still has a call in flight.
        """
        size = self.size
        if actions is not None and (isinstance(actions, (str, bytes)) or len(actions) != size):
            raise ValueError(f"actions must be a sequence of {size} (one per slot)")
        if mask is None:
            chosen = list(range(size))
        else:
            if isinstance(mask, (str, bytes)) or len(mask) != size:
                raise ValueError(f"mask must be a sequence of {size} booleans")
            chosen = [i for i, m in enumerate(mask) if m]
        in_flight = busy(chosen)
        if in_flight:
            raise ValueError(f"slots {in_flight} still have a call in flight (collect a sent "
                             "step with step_recv(); one batch call at a time per slot)")
        return chosen

    def seconds(self, timeout: float | UnsetType | None) -> float | None:
        """A batch call's deadline: ``timeout``, or ``batch_timeout`` when not given.

        Raises:
            TypeError: not a number (a bool is not one).
            ValueError: not positive.
        """
        seconds = self.batch_timeout if timeout is UNSET else timeout
        check_number(seconds, "timeout", above=0, optional=True)
        return seconds


def _client_config(config: ClientConfig | None,
                   options: Mapping[str, Any] | None) -> ClientConfig | None:
    """The pool's client config, from ``client_config`` or the deprecated ``client_options``."""
    if options is not None:
        if config is not None:
            raise ValueError("pass client_config or client_options (deprecated), not both")
        if "on_session_lost" in options:
            raise ValueError("pass on_session_lost to EnvPool, not in client_options")
        return config_from_options(options)
    if config is None:
        return None
    if not isinstance(config, ClientConfig):
        raise TypeError(f"client_config must be a ClientConfig or None, "
                        f"got {type(config).__name__}")
    if config.on_session_lost != "raise":
        raise ValueError("pass on_session_lost to EnvPool, not in client_config (the pool "
                         "rebuilds lost episodes itself)")
    return config


def _check_client(client: object) -> None:
    if isinstance(client, type):
        if not issubclass(client, EnvClient):
            raise TypeError(f"client must be an EnvClient subclass, got {client.__name__}")
    elif not callable(client):
        raise TypeError("client must be an EnvClient subclass or a callable url -> client")
