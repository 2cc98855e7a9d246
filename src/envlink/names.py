"""The names envlink's telemetry uses: the single list, and a public contract.

Span, metric, attribute, span-event and log-event names, and histogram buckets,
as documented in ``docs/telemetry.md`` (whose contract test checks this module):
dashboards, alert rules and documentation refer to them. Semantic-convention
constants are used where a stable one exists. ``envlink.telemetry`` re-exports
everything here; this module imports no OpenTelemetry API or SDK, so reading a
name costs nothing.
"""

from __future__ import annotations

from typing import Final

from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT

from envlink import _errors

__all__ = [
    "SPAN_HARNESS_TURN",
    "ATTR_POOL_SIZE",
    "ATTR_POOL_SLOTS",
    "ATTR_POOL_ERRORS",
    "ATTR_POOL_ERROR_TYPE",
    "ATTR_POOL_STRAGGLERS",
    "ATTR_POOL_MIN_READY",
    "ATTR_SESSION_STATE",
    "ATTR_BREAKER_STATE",
    "ATTR_PLACEMENT_RESULT",
    "ATTR_FLEET_KIND",
    "ATTR_FLEET_SCOPE",
    "ATTR_FLEET_WAITED",
    "ATTR_FLEET_HOLDERS",
    "ATTR_FLEET_LIMIT",
    "METRIC_POOL_BATCH_DURATION",
    "METRIC_POOL_STRAGGLERS",
    "METRIC_POOL_SESSIONS",
    "METRIC_POOL_BREAKER_TRANSITIONS",
    "METRIC_POOL_BREAKER_STATE",
    "METRIC_POOL_PLACEMENTS",
    "METRIC_FLEET_WAIT_DURATION",
    "METRIC_FLEET_HOLDERS",
    "METRIC_FLEET_LIMIT",
    "SLOT_BUCKETS",
    "SPAN_POOL_PREFIX",
    "SPAN_POOL_RECV",
    "LOG_POOL_BREAKER_CHANGED",
    "LOG_POOL_CAPACITY_WAIT",
    "LOG_POOL_SESSION_MOVED",
    "SPAN_RAY_SHARD_PREFIX",
    "ATTR_RAY_SHARD",
    "ATTR_RAY_SHARDS",
    "LOG_RAY_SHARD_LOST",
    "RAY_METRIC_SHARD_RESTARTS",
    "RAY_RESTART_DIED",
    "RAY_RESTART_UNRESPONSIVE",
    "ATTR_ATTEMPT",
    "ATTR_BRIDGE_QUEUE_WAIT",
    "ATTR_BRIDGE_RUN_TIME",
    "ATTR_DELAY",
    "ATTR_DIRECTION",
    "ATTR_EPISODE_ID",
    "ATTR_ERROR_TYPE",
    "ATTR_EXTENSIONS",
    "ATTR_OUTCOME",
    "ATTR_POLICY",
    "ATTR_RECOVERY",
    "ATTR_QUEUE_WAIT",
    "ATTR_REASON",
    "ATTR_REPLAY_STEPS",
    "ATTR_RESULT",
    "ATTR_RETRY",
    "ATTR_RPC_METHOD",
    "ATTR_RPC_STATUS_CODE",
    "ATTR_RPC_SYSTEM",
    "ATTR_SERVER_ADDRESS",
    "ATTR_SERVER_PORT",
    "ATTR_SESSION_ID",
    "ATTR_STEP_INDEX",
    "ATTR_TRANSPARENT",
    "DURATION_BUCKETS",
    "EVENT_ATTACH_WAIT",
    "EVENT_FLEET_WAIT",
    "EVENT_EXCEPTION",
    "EVENT_RECONNECT_SCHEDULED",
    "EVENT_SESSION_LOST",
    "HOOK_RECONNECT",
    "HOOK_RECOVERY_FINISHED",
    "LOG_ATTACH_WAIT",
    "LOG_CALL_FAILED",
    "LOG_CLIENT_CLOSED",
    "LOG_CONNECT",
    "LOG_CONNECTED",
    "LOG_CONNECTION_DISCARDED",
    "LOG_DISCONNECT",
    "LOG_EVENTS",
    "LOG_PEER_UNRESPONSIVE",
    "LOG_PROVIDER_STOP_FAILED",
    "LOG_RECONNECT_SCHEDULED",
    "LOG_REPLAY_DIVERGED",
    "LOG_SESSION_LOST",
    "LOG_SESSION_RECOVERED",
    "LOG_RECOVERY_FALLBACK",
    "LOG_DETACHED_UNAVAILABLE",
    "LOG_SESSION_RELEASE_FAILED",
    "LOG_STALE_ANSWER_DROPPED",
    "LOG_UNKNOWN_STEP_SETTLED",
    "LOG_UNATTRIBUTABLE_FRAME",
    "METRIC_ATTEMPTS",
    "METRIC_BRIDGE_CALL_DURATION",
    "METRIC_BRIDGE_WAIT_DURATION",
    "METRIC_CALL_DURATION",
    "METRIC_CONNECT_DURATION",
    "METRIC_ERRORS",
    "METRIC_INFLIGHT",
    "METRIC_MESSAGE_SIZE",
    "METRIC_NAMES",
    "METRIC_RECONNECTS",
    "METRIC_RECOVERIES",
    "OUTCOME_CANCELLED",
    "OUTCOME_ERROR",
    "OUTCOME_OK",
    "OUTCOME_TIMEOUT",
    "RPC_DURATION_BUCKETS",
    "RPC_METHOD_CONNECT",
    "RPC_SYSTEM",
    "SCOPE_NAME",
    "SIZE_BUCKETS",
    "SPAN_BRIDGE_PREFIX",
    "SPAN_CONNECT",
    "SPAN_EVENTS",
]

SCOPE_NAME = "envlink"
RPC_SYSTEM = "openenv"

# Span and metric attribute names: the semantic conventions' constants where a stable
# one exists; the RPC ones are still incubating in the semconv package, so they are
# spelled out (as of semconv 1.40: rpc.system.name, rpc.method, rpc.response.status_code).
ATTR_RPC_SYSTEM = "rpc.system.name"
ATTR_RPC_METHOD = "rpc.method"
#: The status a failed call's server answered with (its error frame's code).
ATTR_RPC_STATUS_CODE = "rpc.response.status_code"
ATTR_SERVER_ADDRESS: Final = SERVER_ADDRESS
ATTR_SERVER_PORT: Final = SERVER_PORT
ATTR_ERROR_TYPE: Final = ERROR_TYPE
ATTR_SESSION_ID = "envlink.session.id"
ATTR_EPISODE_ID = "envlink.episode.id"
ATTR_STEP_INDEX = "envlink.step.index"
ATTR_ATTEMPT = "envlink.attempt"
ATTR_TRANSPARENT = "envlink.retry.transparent"
ATTR_OUTCOME = "envlink.outcome"
ATTR_REASON = "envlink.reason"
ATTR_DIRECTION = "envlink.direction"
ATTR_POLICY = "envlink.recovery.policy"
#: The recovery mechanism (raise, replay, envlink-resume, openenv-resume).
ATTR_RECOVERY = "envlink.recovery"
ATTR_RESULT = "envlink.recovery.result"
ATTR_BRIDGE_QUEUE_WAIT = "envlink.bridge.queue_wait_s"
ATTR_BRIDGE_RUN_TIME = "envlink.bridge.run_time_s"
ATTR_QUEUE_WAIT = "envlink.queue_wait_s"
ATTR_DELAY = "envlink.delay_s"
ATTR_EXTENSIONS = "envlink.extensions"
ATTR_REPLAY_STEPS = "envlink.replay.steps"
#: On envlink.client.attempts: whether the attempt is a retry.
ATTR_RETRY = "envlink.retry"
# EnvPool: batch spans and pool metrics.
ATTR_POOL_SIZE = "envlink.pool.size"
ATTR_POOL_SLOTS = "envlink.pool.slots"
ATTR_POOL_ERRORS = "envlink.pool.errors"
#: On a batch span: the failed slots' error type (or ``mixed``); not ``error.type``, since
#: a batch whose slots failed did not fail itself.
ATTR_POOL_ERROR_TYPE = "envlink.pool.error_type"
ATTR_POOL_STRAGGLERS = "envlink.pool.stragglers"
ATTR_POOL_MIN_READY = "envlink.pool.min_ready"
ATTR_SESSION_STATE = "envlink.pool.session.state"
ATTR_BREAKER_STATE = "envlink.breaker.state"
ATTR_PLACEMENT_RESULT = "envlink.placement.result"
# The fleet's shared limits (FleetLimits): what a wait was for (``session``,
# ``session_rate``, ``provider_start``, ``provider_start_rate``), its scope (an
# endpoint's URL, or the fleet-wide starts), how long it took, and what the store held.
ATTR_FLEET_KIND = "envlink.fleet.kind"
ATTR_FLEET_SCOPE = "envlink.fleet.scope"
ATTR_FLEET_WAITED = "envlink.fleet.waited_s"
ATTR_FLEET_HOLDERS = "envlink.fleet.holders"
ATTR_FLEET_LIMIT = "envlink.fleet.limit"

#: ``rpc.method`` of a failed ``connect()`` on ``envlink.client.errors``. Connecting is
#: not an RPC (no ``rpc.client.call.duration`` record), but a client that cannot
#: connect must count as failing: the availability SLO and the retry-budget alert read
#: these failures (docs/telemetry.md, docs/operations.md).
RPC_METHOD_CONNECT = "connect"

# Metric names.
METRIC_CALL_DURATION = "rpc.client.call.duration"
#: Connection attempts (WebSocket upgrades); connecting is not an RPC method.
METRIC_CONNECT_DURATION = "envlink.client.connect.duration"
METRIC_BRIDGE_WAIT_DURATION = "envlink.bridge.wait.duration"
METRIC_BRIDGE_CALL_DURATION = "envlink.bridge.call.duration"
METRIC_ATTEMPTS = "envlink.client.attempts"
METRIC_RECONNECTS = "envlink.client.reconnects"
METRIC_ERRORS = "envlink.client.errors"
METRIC_INFLIGHT = "envlink.client.inflight"
METRIC_MESSAGE_SIZE = "envlink.client.message.size"
METRIC_RECOVERIES = "envlink.session.recoveries"
METRIC_POOL_BATCH_DURATION = "envlink.pool.batch.duration"
METRIC_POOL_STRAGGLERS = "envlink.pool.stragglers"
METRIC_POOL_SESSIONS = "envlink.pool.sessions"
METRIC_POOL_BREAKER_TRANSITIONS = "envlink.pool.breaker.transitions"
#: The current state of each EnvPool endpoint's breaker (a state set: 1 for the current
#: state, 0 for the others), read when metrics are collected.
METRIC_POOL_BREAKER_STATE = "envlink.pool.breaker.state"
METRIC_POOL_PLACEMENTS = "envlink.pool.placements"
#: Each wait for a fleet slot or pace token: how long, and the holders and the limit
#: the store had when it ended.
METRIC_FLEET_WAIT_DURATION = "envlink.fleet.wait.duration"
METRIC_FLEET_HOLDERS = "envlink.fleet.holders"
METRIC_FLEET_LIMIT = "envlink.fleet.limit"
#: Every metric envlink emits (the contract documented in docs/telemetry.md).
METRIC_NAMES: tuple[str, ...] = (
    METRIC_CALL_DURATION, METRIC_CONNECT_DURATION, METRIC_BRIDGE_WAIT_DURATION,
    METRIC_BRIDGE_CALL_DURATION, METRIC_ATTEMPTS, METRIC_RECONNECTS, METRIC_ERRORS,
    METRIC_INFLIGHT, METRIC_MESSAGE_SIZE, METRIC_RECOVERIES, METRIC_POOL_BATCH_DURATION,
    METRIC_POOL_STRAGGLERS, METRIC_POOL_SESSIONS, METRIC_POOL_BREAKER_TRANSITIONS,
    METRIC_POOL_BREAKER_STATE, METRIC_POOL_PLACEMENTS, METRIC_FLEET_WAIT_DURATION,
    METRIC_FLEET_HOLDERS, METRIC_FLEET_LIMIT,
)

# Span names: a protocol call's span is named for its method (``reset``, ``step``...),
# a retried call's attempts ``<method> attempt``, a bridged call ``envlink.bridge <method>``.
SPAN_CONNECT = "connect"
#: One turn of a harness session (``/harness``), from the message to ``turn_complete``.
SPAN_HARNESS_TURN = "harness_turn"
SPAN_BRIDGE_PREFIX = "envlink.bridge "
#: A pool's batch call: ``envlink.pool reset``, ``envlink.pool step``.
SPAN_POOL_PREFIX = "envlink.pool "
#: A pool's ready-first receive (``EnvPool.step_recv``).
SPAN_POOL_RECV = "envlink.pool recv"
#: Span event on a call's span when a reconnect is scheduled.
EVENT_RECONNECT_SCHEDULED = "reconnect_scheduled"
#: Span event on a call's span when its session was lost and recovery starts.
EVENT_SESSION_LOST = "envlink.session_lost"
#: Span event when the server refused an attach for now (its old socket is still
#: attached) and the client waits within the call's deadline before asking again.
EVENT_ATTACH_WAIT = "envlink.attach_wait"
#: Span event on the call's span after it waited for a fleet slot or pace token.
EVENT_FLEET_WAIT = "envlink.fleet_wait"
#: The semantic conventions' span event for an exception (``Span.record_exception``).
EVENT_EXCEPTION = "exception"
#: Every span event envlink emits.
SPAN_EVENTS: tuple[str, ...] = (EVENT_RECONNECT_SCHEDULED, EVENT_SESSION_LOST,
                                EVENT_ATTACH_WAIT, EVENT_FLEET_WAIT, EVENT_EXCEPTION)

# structlog event names (logger ``envlink``); the client's hooks report the same names.
LOG_CONNECT = "envlink.connect"
LOG_CONNECTED = "envlink.connected"
LOG_DISCONNECT = "envlink.disconnect"
LOG_CONNECTION_DISCARDED = "envlink.connection_discarded"
LOG_STALE_ANSWER_DROPPED = "envlink.stale_answer_dropped"
LOG_CLIENT_CLOSED = "envlink.client_closed"
LOG_PEER_UNRESPONSIVE = "envlink.peer_unresponsive"
LOG_UNATTRIBUTABLE_FRAME = "envlink.unattributable_frame"
LOG_SESSION_RELEASE_FAILED = "envlink.session_release_failed"
LOG_PROVIDER_STOP_FAILED = "envlink.provider_stop_failed"
LOG_RECONNECT_SCHEDULED = "envlink.reconnect_scheduled"
LOG_ATTACH_WAIT = "envlink.attach_wait"
LOG_CALL_FAILED = "envlink.call_failed"
LOG_SESSION_LOST = "envlink.session_lost"
LOG_SESSION_RECOVERED = "envlink.session_recovered"
LOG_RECOVERY_FALLBACK = "envlink.recovery_fallback"
LOG_DETACHED_UNAVAILABLE = "envlink.detached_sessions_unavailable"
LOG_REPLAY_DIVERGED = "envlink.replay_diverged"
LOG_UNKNOWN_STEP_SETTLED = "envlink.unknown_step_settled"
LOG_POOL_BREAKER_CHANGED = "envlink.pool.breaker_changed"
LOG_POOL_CAPACITY_WAIT = "envlink.pool.capacity_wait"
LOG_POOL_SESSION_MOVED = "envlink.pool.session_moved"
# envlink.ray (documented in docs/scaling.md: Ray is an optional extra, outside the
# contract tables that the scripted single-process episode checks).
#: A shard actor's call: ``envlink.ray.shard reset``, ``... step``, ``... recv``, ``... restore``.
SPAN_RAY_SHARD_PREFIX = "envlink.ray.shard "
ATTR_RAY_SHARD = "envlink.ray.shard"
ATTR_RAY_SHARDS = "envlink.ray.shards"
LOG_RAY_SHARD_LOST = "envlink.ray.shard_lost"
#: Shard actors replaced by the driver (attributes ``envlink.ray.shard``, ``envlink.reason``).
#: Not ``METRIC_*``: every ``METRIC_*`` name is in METRIC_NAMES, the single-process contract.
RAY_METRIC_SHARD_RESTARTS = "envlink.ray.shard.restarts"
#: ``envlink.reason`` of a restart: the actor died (killed, node or process lost)...
RAY_RESTART_DIED = "died"
#: ... or did not answer within the batch deadline plus ``shard_timeout_margin``.
RAY_RESTART_UNRESPONSIVE = "unresponsive"
#: Every log event envlink's client emits (the contract documented in docs/telemetry.md).
LOG_EVENTS: tuple[str, ...] = (
    LOG_CONNECT, LOG_CONNECTED, LOG_DISCONNECT, LOG_CONNECTION_DISCARDED,
    LOG_STALE_ANSWER_DROPPED, LOG_CLIENT_CLOSED, LOG_PEER_UNRESPONSIVE,
    LOG_UNATTRIBUTABLE_FRAME, LOG_SESSION_RELEASE_FAILED, LOG_RECONNECT_SCHEDULED,
    LOG_ATTACH_WAIT, LOG_CALL_FAILED, LOG_SESSION_LOST, LOG_SESSION_RECOVERED, LOG_REPLAY_DIVERGED,
    LOG_UNKNOWN_STEP_SETTLED, LOG_RECOVERY_FALLBACK, LOG_DETACHED_UNAVAILABLE,
    LOG_POOL_BREAKER_CHANGED, LOG_POOL_CAPACITY_WAIT,
    LOG_POOL_SESSION_MOVED, LOG_PROVIDER_STOP_FAILED,
)
#: Hook events that are counted, not logged.
HOOK_RECONNECT = "envlink.reconnect"
HOOK_RECOVERY_FINISHED = "envlink.recovery_finished"

#: Outcomes of a call (``envlink.outcome``): defined with the error tree, which the
#: bridge shares without knowing telemetry names.
OUTCOME_OK: Final = _errors.OUTCOME_OK
OUTCOME_ERROR: Final = _errors.OUTCOME_ERROR
OUTCOME_TIMEOUT: Final = _errors.OUTCOME_TIMEOUT
OUTCOME_CANCELLED: Final = _errors.OUTCOME_CANCELLED

#: Boundaries of ``rpc.client.call.duration``: the semantic conventions' advisory
#: buckets for RPC durations (seconds).
RPC_DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)
#: Histogram boundaries in seconds of envlink's own durations (bridge hops, connection
#: attempts), which reach well below a millisecond. The SDK's defaults are meant for
#: milliseconds and would put every envlink call in the first bucket.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
#: Histogram boundaries in bytes for message sizes.
#: Buckets of the fleet's holders and limits (slots).
SLOT_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
SIZE_BUCKETS: tuple[float, ...] = (
    64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 104857600,
)
