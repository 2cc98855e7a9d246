"""envlink: a hardened, traced client SDK for OpenEnv-compatible environment servers.

The async client (:class:`EnvClient`) speaks the OpenEnv WebSocket protocol with
deadlines, reconnects, retries by idempotency and session recovery; ``client.sync()``
gives a traced blocking facade (:class:`SyncEnvClient`) on a background event-loop
thread (:class:`Bridge`). Every error derives from :class:`EnvlinkError`. Hooks that
observe a client or a bridge, and the records they receive, are in :mod:`envlink.hooks`;
the echo environment's typed client is in :mod:`envlink.echo_env`.
"""

from __future__ import annotations

from importlib import import_module as _import_module
from typing import TYPE_CHECKING, Any

from envlink._bridge import Bridge, SyncProxy, set_default_hooks
from envlink._client.blocking import SyncEnv, set_sync_facade
from envlink._client.client import EnvClient, GenericEnvClient, StepResult
from envlink._client.configuration import ClientConfig
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
    FeatureUnavailableError,
    FleetStoreError,
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
from envlink._fleet import FleetLimits
from envlink._launch.discovery import EnvironmentMetadata, EnvironmentSchema, Health
from envlink._launch.lifecycle import Bootstrap
from envlink._launch.providers import DockerProvider, LocalServerProvider
from envlink._launch.spaces import hf_space_subdomain
from envlink._sansio.journal import EpisodeJournal, JournalEntry
from envlink._sansio.policies import ReconnectPolicy, RetryBudget, SessionLostPolicy, set_testing
from envlink._sansio.session_limits import Limits, get_limits, set_limits
from envlink._sansio.state import State
from envlink._version import __version__ as __version__

# Aliases of the names public modules own (not in __all__; `X as X` re-exports them).
from envlink.hooks import BridgeCallFinished as BridgeCallFinished
from envlink.hooks import BridgeCallStarted as BridgeCallStarted
from envlink.hooks import BridgeHook as BridgeHook
from envlink.hooks import CallFinished as CallFinished
from envlink.hooks import CallStarted as CallStarted
from envlink.hooks import ClientEvent as ClientEvent
from envlink.hooks import ClientHook as ClientHook
from envlink.hooks import PhaseFinished as PhaseFinished
from envlink.hooks import PhaseStarted as PhaseStarted

if TYPE_CHECKING:
    from collections.abc import Sequence

    from envlink._client.handles import SessionHandle
    from envlink._openenv.adopt import adopt
    from envlink._openenv.auto import AutoAction, AutoEnv, GenericAction
    from envlink._openenv.harness import (
        HarnessClient,
        HarnessEvent,
        HarnessEventType,
        HarnessProtocolError,
        HarnessTurnError,
    )
    from envlink._openenv.mcp_client import (
        CallToolAction,
        CallToolObservation,
        ListToolsAction,
        ListToolsObservation,
        MCPClientBase,
        MCPObservation,
        MCPToolClient,
        Tool,
        ToolError,
        ToolErrorType,
    )
    from envlink._pool.pool import AutoresetMode, EnvPool
    from envlink._pool.results import Batch, EndpointView, PoolView
    from envlink._pool.sync_pool import SyncEnvPool
    from envlink._recording.recorder import RolloutRecorder
    from envlink._sync.default_bridge import default_bridge
    from envlink._sync.sync_client import SyncEnvClient
    from envlink._transports.mock import MockTransport
    from envlink.echo_env import EchoEnv as EchoEnv
    from envlink.echo_env import EchoObservation as EchoObservation
    from envlink.telemetry import configure


def _bridge_hooks(tracer_provider: Any, meter_provider: Any) -> Sequence[BridgeHook]:
    # The emitter (and its OpenTelemetry metrics API) is imported by the first bridge.
    from envlink._telemetry.bridge_hook import default_bridge_hooks

    return default_bridge_hooks(tracer_provider, meter_provider)


# The generic bridge imports no telemetry: envlink gives it its OpenTelemetry emitter.
set_default_hooks(_bridge_hooks)


def _sync_facade(client: Any, bridge: Bridge | None, nested_spans: bool
                 ) -> SyncEnv[Any, Any, Any]:
    # The blocking layer is imported by the first client.sync() (or blocking call).
    from envlink._sync.sync_client import SyncEnvClient

    return SyncEnvClient(client, bridge=bridge, nested_spans=nested_spans)


# The client imports no blocking layer: envlink gives it the facade that client.sync() makes.
set_sync_facade(_sync_facade)

#: Public names whose module is imported on first access (PEP 562), not by
#: `import envlink`: what a plain client does not need to connect and step (the
#: pools, the echo environment and MCP clients, the mock transport, the sync
#: facade's class) and configure(), which lives with the OpenTelemetry SDK.
#: tests/test_import_laziness.py pins what `import envlink` leaves unloaded.
_LAZY = {
    "AutoAction": "envlink._openenv.auto",
    "AutoEnv": "envlink._openenv.auto",
    "GenericAction": "envlink._openenv.auto",
    "adopt": "envlink._openenv.adopt",
    "default_bridge": "envlink._sync.default_bridge",
    "SessionHandle": "envlink._client.handles",
    "HarnessClient": "envlink._openenv.harness",
    "HarnessEvent": "envlink._openenv.harness",
    "HarnessEventType": "envlink._openenv.harness",
    "HarnessProtocolError": "envlink._openenv.harness",
    "HarnessTurnError": "envlink._openenv.harness",
    "CallToolAction": "envlink._openenv.mcp_client",
    "CallToolObservation": "envlink._openenv.mcp_client",
    "ListToolsAction": "envlink._openenv.mcp_client",
    "ListToolsObservation": "envlink._openenv.mcp_client",
    "MCPClientBase": "envlink._openenv.mcp_client",
    "MCPObservation": "envlink._openenv.mcp_client",
    "MCPToolClient": "envlink._openenv.mcp_client",
    "Tool": "envlink._openenv.mcp_client",
    "ToolError": "envlink._openenv.mcp_client",
    "ToolErrorType": "envlink._openenv.mcp_client",
    "SyncEnvClient": "envlink._sync.sync_client",
    "AutoresetMode": "envlink._pool.pool",
    "EnvPool": "envlink._pool.pool",
    "Batch": "envlink._pool.results",
    "EndpointView": "envlink._pool.results",
    "PoolView": "envlink._pool.results",
    "SyncEnvPool": "envlink._pool.sync_pool",
    "MockTransport": "envlink._transports.mock",
    "RolloutRecorder": "envlink._recording.recorder",
    "EchoEnv": "envlink.echo_env",  # an alias: envlink.echo_env owns it
    "EchoObservation": "envlink.echo_env",  # an alias: envlink.echo_env owns it
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
    return sorted(set(globals()) | set(__all__) | set(_LAZY))


#: Grouped by what a user does with them, sorted within each group. The hook
#: interfaces and records (envlink.hooks) and the echo client (envlink.echo_env) are
#: importable from here too, as aliases, but are listed by their own modules.
__all__ = [
    "__version__",
    # clients and what they return
    "AutoAction",
    "AutoEnv",
    "EnvClient",
    "GenericAction",
    "GenericEnvClient",
    "SessionHandle",
    "State",
    "StepResult",
    "SyncEnvClient",
    "adopt",
    # MCP clients, their actions, observations and tools
    "CallToolAction",
    "CallToolObservation",
    "ListToolsAction",
    "ListToolsObservation",
    "MCPClientBase",
    "MCPObservation",
    "MCPToolClient",
    "Tool",
    "ToolError",
    "ToolErrorType",
    # the /harness stream
    "HarnessClient",
    "HarnessEvent",
    "HarnessEventType",
    "HarnessProtocolError",
    "HarnessTurnError",
    # configuration, policies and limits
    "UNSET",
    "ClientConfig",
    "ConnectionOptions",
    "EpisodeJournal",
    "FleetLimits",
    "JournalEntry",
    "Limits",
    "ReconnectPolicy",
    "RetryBudget",
    "SessionLostPolicy",
    "Timeout",
    "get_limits",
    "set_limits",
    # testing without a server
    "MockTransport",
    "set_testing",
    # rollouts on disk
    "RolloutRecorder",
    # the sync bridge
    "Bridge",
    "SyncProxy",
    "default_bridge",
    # many sessions
    "AutoresetMode",
    "Batch",
    "EndpointView",
    "EnvPool",
    "PoolView",
    "SyncEnvPool",
    # where the server comes from: providers, Spaces, readiness and discovery
    "Bootstrap",
    "DockerProvider",
    "EnvironmentMetadata",
    "EnvironmentSchema",
    "Health",
    "LocalServerProvider",
    "hf_space_subdomain",
    # telemetry (the rest is in envlink.telemetry)
    "configure",
    # errors: EnvlinkError and what derives from it
    "CallTimeoutError",
    "CapacityReachedError",
    "ClientClosedError",
    "ConnectError",
    "ConnectionLostError",
    "EnvlinkError",
    "ErrorCode",
    "ExecutionModeError",
    "FactoryError",
    "FeatureUnavailableError",
    "FleetStoreError",
    "HandshakeRejectedError",
    "HttpStatusError",
    "InvalidActionError",
    "InvalidArgumentError",
    "InvalidURLError",
    "McpError",
    "NotReadyError",
    "OutcomeUnknownError",
    "ProtocolError",
    "ProviderError",
    "ReentrantCallError",
    "ReplayDivergedError",
    "RetryBudgetExhaustedError",
    "ServerError",
    "ServerValidationError",
    "SessionError",
    "SessionGoneError",
    "SessionLostError",
    "SpaceNotAwakeError",
    "ToolCallError",
]
