"""envlink: a hardened, traced client SDK for OpenEnv-compatible environment servers.

The async client (:class:`EnvClient`) speaks the OpenEnv WebSocket protocol with
deadlines, reconnects, retries by idempotency and session recovery; ``client.sync()``
gives a traced blocking facade (:class:`SyncEnvClient`) on a background event-loop
thread (:class:`Bridge`). Every error derives from :class:`EnvlinkError`.
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"

from typing import TYPE_CHECKING, Any

from envlink._bridge import (
    Bridge,
    BridgeCallFinished,
    BridgeCallStarted,
    BridgeHook,
    SyncProxy,
    set_default_hooks,
)
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
    FactoryError,
    HandshakeRejectedError,
    McpError,
    OutcomeUnknownError,
    ProtocolError,
    ReentrantCallError,
    ReplayDivergedError,
    RetryBudgetExhaustedError,
    ServerError,
    ServerValidationError,
    SessionError,
    SessionGoneError,
    SessionLostError,
    ToolCallError,
)
from envlink._hooks import (
    CallFinished,
    CallStarted,
    ClientEvent,
    ClientHook,
    PhaseFinished,
    PhaseStarted,
)
from envlink._journal import EpisodeJournal, JournalEntry
from envlink._mock import MockTransport
from envlink._policies import ReconnectPolicy, RetryBudget, SessionLostPolicy, set_testing
from envlink._pool import AutoresetMode, EnvPool
from envlink._pool_sync import SyncEnvPool
from envlink._pool_types import Batch, EndpointView, PoolView
from envlink._sync import SyncEnvClient
from envlink._telemetry_bridge import default_bridge_hooks

if TYPE_CHECKING:
    from envlink.telemetry import configure

# The generic bridge imports no telemetry: envlink gives it its OpenTelemetry emitter.
set_default_hooks(default_bridge_hooks)


def __getattr__(name: str) -> Any:
    # configure() lives with the OpenTelemetry SDK setup; import it only when asked
    # for, so that `import envlink` stays light for applications that bring their own.
    if name == "configure":
        from envlink.telemetry import configure

        return configure
    raise AttributeError(f"module 'envlink' has no attribute {name!r}")

__all__ = [
    "UNSET",
    "AutoresetMode",
    "Batch",
    "Bridge",
    "BridgeCallFinished",
    "BridgeCallStarted",
    "BridgeHook",
    "CallFinished",
    "CallStarted",
    "CallTimeoutError",
    "CallToolAction",
    "CapacityReachedError",
    "ClientClosedError",
    "ClientEvent",
    "ClientHook",
    "ConnectError",
    "ConnectionLostError",
    "ConnectionOptions",
    "EchoEnv",
    "EchoObservation",
    "EndpointView",
    "EnvClient",
    "EnvPool",
    "EnvlinkError",
    "EpisodeJournal",
    "ErrorCode",
    "GenericEnvClient",
    "FactoryError",
    "HandshakeRejectedError",
    "McpError",
    "JournalEntry",
    "ListToolsAction",
    "MockTransport",
    "OutcomeUnknownError",
    "PhaseFinished",
    "PhaseStarted",
    "PoolView",
    "ProtocolError",
    "ReconnectPolicy",
    "ReentrantCallError",
    "ReplayDivergedError",
    "RetryBudget",
    "RetryBudgetExhaustedError",
    "ServerError",
    "ServerValidationError",
    "SessionError",
    "SessionGoneError",
    "SessionLostError",
    "SessionLostPolicy",
    "StepResult",
    "SyncEnvClient",
    "SyncEnvPool",
    "SyncProxy",
    "Timeout",
    "ToolCallError",
    "__version__",
    "configure",
    "set_testing",
]
