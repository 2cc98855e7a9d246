"""A session's driver and connector built from their parts over a MockTransport."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from envlink import ConnectionOptions, MockTransport, ReconnectPolicy, Timeout
from envlink._client.connector import Connector
from envlink._client.driver import SessionDriver, end_turn, take_turn, wait_turn
from envlink._sansio.session import Call, SessionCore
from envlink._transports.base import parse_endpoint
from envlink.hooks import (
    CallFinished,
    CallStarted,
    ClientEvent,
    ClientHook,
    PhaseFinished,
    PhaseStarted,
)

__all__ = ["Parts", "Recorder", "build", "obs"]


def obs(**observation: Any) -> dict[str, Any]:
    return {"type": "observation", "data": {"observation": observation}}


@dataclass
class Recorder(ClientHook):
    """Records everything a client reports, in order; ``tokens`` pairs each finish with
    the token its start returned."""

    records: list[Any] = field(default_factory=list)
    tokens: list[Any] = field(default_factory=list)

    def call_started(self, call: CallStarted) -> Any:
        self.records.append(call)
        return ("call", call.method)

    def call_finished(self, call: CallFinished, token: Any) -> None:
        self.records.append(call)
        self.tokens.append(token)

    def phase_started(self, phase: PhaseStarted) -> Any:
        self.records.append(phase)
        return ("phase", phase.phase)

    def phase_finished(self, phase: PhaseFinished, token: Any) -> None:
        self.records.append(phase)
        self.tokens.append(token)

    def event(self, event: ClientEvent) -> None:
        self.records.append(event)

    def of(self, kind: type) -> list[Any]:
        return [r for r in self.records if type(r) is kind]

    def events(self) -> list[str]:
        return [e.name for e in self.of(ClientEvent)]


@dataclass
class Parts:
    core: SessionCore
    connector: Connector
    driver: SessionDriver
    hook: Recorder
    transport: MockTransport


def build(handler: Callable[[dict[str, Any]], Any], *, extensions: bool = False,
          timeouts: Timeout | None = None, policy: ReconnectPolicy | None = None,
          options: ConnectionOptions | None = None,
          on_session_lost: Any = "raise") -> Parts:
    """A driver, its connector and its core, as the client wires them."""
    transport = MockTransport(handler, extensions=extensions)
    policy = policy or ReconnectPolicy(max_attempts=3, initial_delay=0.001, max_delay=0.002)
    timeouts = timeouts or Timeout(5.0)
    options = options or ConnectionOptions()
    hook = Recorder()
    core = SessionCore(policy=policy, on_session_lost=on_session_lost)
    connector = Connector(parse_endpoint("http://env.test"), options, transport, timeouts,
                          policy, extensions, core, hook)
    driver = SessionDriver(core, connector, hook, options, timeouts,
                           lambda recorded, replayed: recorded == replayed)
    return Parts(core, connector, driver, hook, transport)


@contextlib.asynccontextmanager
async def turn(driver: SessionDriver, call: Call) -> AsyncIterator[None]:
    """The session's turn for one call, as the client's calls take it."""
    lock = take_turn(driver, call) or await wait_turn(driver, call)
    try:
        yield
    finally:
        end_turn(driver, lock)
