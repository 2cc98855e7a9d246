"""The envlink reference server: an OpenEnv-compatible environment server.

Built on the ``websockets`` asyncio server. It speaks the OpenEnv WebSocket
protocol on ``/ws`` (and answers ``/health``), serves pluggable environments
(``echo``, matching OpenEnv's echo example, and a seeded ``deterministic`` one),
offers envlink's negotiated extensions (request ids with de-duplication,
per-message trace context, session resumption, optionally persisted across a
process restart), and injects faults for tests, benchmarks and the demo::

    async with EnvServer(env="echo", port=0) as server:
        ...  # connect to server.url + "/ws"

    with ServerThread(env="deterministic") as st:   # for synchronous code
        st.call(lambda server: server.steps_applied)

``main(argv)`` implements ``envlink serve``.
"""

from __future__ import annotations

from envlink.server._command import main
from envlink.server._connection import ConnectionHandle
from envlink.server._environments.deterministic import DeterministicEnvironment
from envlink.server._environments.echo import EchoEnvironment
from envlink.server._environments.environment import (
    ActionRejectedError,
    Environment,
    EnvironmentFactory,
    InvalidActionError,
    SnapshotEnvironment,
    StepResult,
    Transition,
)
from envlink.server._faults import CORRUPT_KINDS, DROP_MODES, CorruptKind, DropMode, Faults
from envlink.server._server import DEFAULT_MAX_MESSAGE_SIZE, ENVIRONMENTS, EnvServer
from envlink.server._store import SessionInfo
from envlink.server._thread import ServerThread

__all__ = [
    "CORRUPT_KINDS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DROP_MODES",
    "ENVIRONMENTS",
    "ActionRejectedError",
    "ConnectionHandle",
    "CorruptKind",
    "DeterministicEnvironment",
    "DropMode",
    "EchoEnvironment",
    "EnvServer",
    "Environment",
    "EnvironmentFactory",
    "Faults",
    "InvalidActionError",
    "ServerThread",
    "SessionInfo",
    "SnapshotEnvironment",
    "StepResult",
    "Transition",
    "main",
]
