"""envlink: a hardened, traced client SDK for OpenEnv-compatible environment servers.

The async client (:class:`EnvClient`) speaks the OpenEnv WebSocket protocol with
deadlines, reconnects, retries by idempotency and session recovery; ``client.sync()``
gives a traced blocking facade (:class:`SyncEnvClient`) on a background event-loop
thread (:class:`Bridge`). Every error derives from :class:`EnvlinkError`.
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"

from envlink._client import EnvClient, GenericEnvClient, StepResult
from envlink._config import UNSET, ConnectionOptions, Timeout
from envlink._echo import CallToolAction, EchoEnv, EchoObservation, ListToolsAction
from envlink._errors import (
    CallTimeoutError,
    CapacityReachedError,
    ClientClosedError,
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    ErrorCode,
    HandshakeRejectedError,
    OutcomeUnknownError,
    ProtocolError,
    ReentrantCallError,
    ReplayDivergedError,
    RetryBudgetExhaustedError,
    ServerError,
    SessionLostError,
)
from envlink._journal import EpisodeJournal, JournalEntry
from envlink._policies import ReconnectPolicy, RetryBudget, SessionLostPolicy, set_testing

__all__ = [
    "UNSET",
    "CallTimeoutError",
    "CallToolAction",
    "CapacityReachedError",
    "ClientClosedError",
    "ConnectError",
    "ConnectionLostError",
    "ConnectionOptions",
    "EchoEnv",
    "EchoObservation",
    "EnvClient",
    "EnvlinkError",
    "EpisodeJournal",
    "ErrorCode",
    "GenericEnvClient",
    "HandshakeRejectedError",
    "JournalEntry",
    "ListToolsAction",
    "OutcomeUnknownError",
    "ProtocolError",
    "ReconnectPolicy",
    "ReentrantCallError",
    "ReplayDivergedError",
    "RetryBudget",
    "RetryBudgetExhaustedError",
    "ServerError",
    "SessionLostError",
    "SessionLostPolicy",
    "StepResult",
    "Timeout",
    "__version__",
    "set_testing",
]
