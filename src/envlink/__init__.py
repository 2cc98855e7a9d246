"""envlink: a hardened, traced client SDK for OpenEnv-compatible environment servers.

The async client (:class:`EnvClient`) speaks the OpenEnv WebSocket protocol with
deadlines, reconnects, retries by idempotency and session recovery; ``client.sync()``
gives a traced blocking facade (:class:`SyncEnvClient`) on a background event-loop
thread (:class:`Bridge`). Every error derives from :class:`EnvlinkError`.
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"

from importlib import import_module as _import_module
from typing import TYPE_CHECKING, Any

from envlink._bridge import (
    Bridge,
    BridgeCallFinished,
    BridgeCallStarted,
    BridgeHook,
    SyncProxy,
    set_default_hooks,
)
from envlink._client.client import EnvClient, GenericEnvClient, StepResult
from envlink._client.configuration import ClientConfig
from envlink._client.events import (
    CallFinished,
    CallStarted,
    ClientEvent,
    ClientHook,
    PhaseFinished,
    PhaseStarted,
)
from envlink._config import UNSET, ConnectionOptions, Timeout
from envlink._errors import (
    CallTimeoutError,
    CapacityReachedError,
    ClientClosedError,
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    ErrorCode,
    ExecutionModeError,
    FactoryError,
    HandshakeRejectedError,
    HttpStatusError,
    InvalidActionError,
    InvalidArgumentError,
    InvalidURLError,
    McpError,
    NotReadyError,
    OutcomeUnknownError,
    ProtocolError,
    ProviderError,
    ReentrantCallError,
    ReplayDivergedError,
    RetryBudgetExhaustedError,
    ServerError,
    ServerValidationError,
    SessionError,
    SessionGoneError,
    SessionLostError,
    SpaceNotAwakeError,
    ToolCallError,
)
from envlink._launch.discovery import EnvironmentMetadata, EnvironmentSchema, Health
from envlink._launch.lifecycle import Bootstrap
from envlink._launch.providers import DockerProvider, LocalServerProvider
from envlink._launch.spaces import hf_space_subdomain
from envlink._sansio.journal import EpisodeJournal, JournalEntry
from envlink._sansio.policies import ReconnectPolicy, RetryBudget, SessionLostPolicy, set_testing
from envlink._sansio.session_limits import Limits, get_limits, set_limits
from envlink._sansio.state import State

if TYPE_CHECKING:
    from collections.abc import Sequence

    from envlink._client.adopt import adopt
    from envlink._client.auto import AutoAction, AutoEnv, GenericAction
    from envlink._client.default_bridge import default_bridge
    from envlink._client.handles import SessionHandle
    from envlink._client.harness import (
        HarnessClient,
        HarnessEvent,
        HarnessEventType,
        HarnessProtocolError,
        HarnessTurnError,
    )
    from envlink._client.mcp_client import (
        MCPClientBase,
        MCPObservation,
        MCPToolClient,
        Tool,
        ToolError,
        ToolErrorType,
    )
    from envlink._client.sync_client import SyncEnvClient
    from envlink._pool.pool import AutoresetMode, EnvPool
    from envlink._pool.results import Batch, EndpointView, PoolView
    from envlink._pool.sync_pool import SyncEnvPool
    from envlink._transports.mock import MockTransport
    from envlink.echo_env import CallToolAction, EchoEnv, EchoObservation, ListToolsAction
    from envlink.telemetry import configure


def _bridge_hooks(tracer_provider: Any, meter_provider: Any) -> Sequence[BridgeHook]:
    # The emitter (and its OpenTelemetry metrics API) is imported by the first bridge.
    from envlink._telemetry.bridge_hook import default_bridge_hooks

    return default_bridge_hooks(tracer_provider, meter_provider)


# The generic bridge imports no telemetry: envlink gives it its OpenTelemetry emitter.
set_default_hooks(_bridge_hooks)

#: Public names whose module is imported on first access (PEP 562), not by
#: `import envlink`: what a plain client does not need to connect and step (the
#: pools, the echo environment and MCP clients, the mock transport, the sync
#: facade's class) and configure(), which lives with the OpenTelemetry SDK.
#: tests/test_import_laziness.py pins what `import envlink` leaves unloaded.
_LAZY = {
    "CallToolAction": "envlink.echo_env",
    "EchoEnv": "envlink.echo_env",
    "EchoObservation": "envlink.echo_env",
    "ListToolsAction": "envlink.echo_env",
    "MCPClientBase": "envlink._client.mcp_client",
    "MCPObservation": "envlink._client.mcp_client",
    "MCPToolClient": "envlink._client.mcp_client",
    "Tool": "envlink._client.mcp_client",
    "ToolError": "envlink._client.mcp_client",
    "ToolErrorType": "envlink._client.mcp_client",
    "MockTransport": "envlink._transports.mock",
    "AutoresetMode": "envlink._pool.pool",
    "EnvPool": "envlink._pool.pool",
    "SyncEnvPool": "envlink._pool.sync_pool",
    "Batch": "envlink._pool.results",
    "EndpointView": "envlink._pool.results",
    "PoolView": "envlink._pool.results",
    "SyncEnvClient": "envlink._client.sync_client",
    "HarnessClient": "envlink._client.harness",
    "HarnessEvent": "envlink._client.harness",
    "HarnessEventType": "envlink._client.harness",
    "HarnessProtocolError": "envlink._client.harness",
    "HarnessTurnError": "envlink._client.harness",
    "default_bridge": "envlink._client.default_bridge",
    "SessionHandle": "envlink._client.handles",
    "adopt": "envlink._client.adopt",
    "AutoAction": "envlink._client.auto",
    "AutoEnv": "envlink._client.auto",
    "GenericAction": "envlink._client.auto",
    "configure": "envlink.telemetry",
}


def _lazy_attribute(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'envlink' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value  # later lookups are plain module attributes
    return value


if not TYPE_CHECKING:
    # Hidden from type checkers, which see the names imported above and so still
    # report a misspelt `envlink.Nmae` (a module __getattr__ would make it Any).
    __getattr__ = _lazy_attribute


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "UNSET",
    "AutoAction",
    "AutoEnv",
    "AutoresetMode",
    "Batch",
    "Bootstrap",
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
    "ClientConfig",
    "ClientEvent",
    "ClientHook",
    "ConnectError",
    "ConnectionLostError",
    "ConnectionOptions",
    "DockerProvider",
    "EchoEnv",
    "EchoObservation",
    "EndpointView",
    "EnvClient",
    "EnvPool",
    "EnvironmentMetadata",
    "EnvironmentSchema",
    "EnvlinkError",
    "EpisodeJournal",
    "ErrorCode",
    "ExecutionModeError",
    "GenericAction",
    "GenericEnvClient",
    "FactoryError",
    "HandshakeRejectedError",
    "Health",
    "HttpStatusError",
    "InvalidActionError",
    "InvalidArgumentError",
    "InvalidURLError",
    "LocalServerProvider",
    "HarnessClient",
    "HarnessEvent",
    "HarnessEventType",
    "HarnessProtocolError",
    "HarnessTurnError",
    "McpError",
    "NotReadyError",
    "JournalEntry",
    "Limits",
    "ListToolsAction",
    "MCPClientBase",
    "MCPObservation",
    "MCPToolClient",
    "MockTransport",
    "OutcomeUnknownError",
    "PhaseFinished",
    "PhaseStarted",
    "PoolView",
    "ProtocolError",
    "ProviderError",
    "ReconnectPolicy",
    "ReentrantCallError",
    "ReplayDivergedError",
    "RetryBudget",
    "RetryBudgetExhaustedError",
    "ServerError",
    "ServerValidationError",
    "SessionError",
    "SessionGoneError",
    "SessionHandle",
    "SessionLostError",
    "SessionLostPolicy",
    "State",
    "SpaceNotAwakeError",
    "StepResult",
    "SyncEnvClient",
    "SyncEnvPool",
    "SyncProxy",
    "Timeout",
    "Tool",
    "ToolCallError",
    "ToolError",
    "ToolErrorType",
    "__version__",
    "adopt",
    "configure",
    "default_bridge",
    "get_limits",
    "set_limits",
    "hf_space_subdomain",
    "set_testing",
]
