"""Each wait for a fleet slot or pace token, reported: a span event and three metrics.

Waiting for the fleet is not server latency: the event on the caller's span
(``envlink.fleet_wait``) and ``envlink.fleet.wait.duration`` say how long a call
waited, with the holders and the limit the store had when the wait ended. Nothing
here raises into the caller.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import trace

from envlink._fleet.backend import STARTS
from envlink._telemetry.instruments import get_telemetry
from envlink.names import (
    ATTR_FLEET_HOLDERS,
    ATTR_FLEET_KIND,
    ATTR_FLEET_LIMIT,
    ATTR_FLEET_SCOPE,
    ATTR_FLEET_WAITED,
    ATTR_SERVER_ADDRESS,
    ATTR_SERVER_PORT,
    EVENT_FLEET_WAIT,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["Providers", "record_wait"]

#: The tracer and meter providers of the caller (``None``: the global ones).
Providers = tuple["TracerProvider | None", "MeterProvider | None"]


def _scope_attributes(scope: str) -> dict[str, Any]:
    if scope.startswith("session "):
        parts = urlsplit(scope[len("session "):])
        return {ATTR_SERVER_ADDRESS: parts.hostname or "", ATTR_SERVER_PORT: parts.port or 0}
    return {ATTR_FLEET_SCOPE: STARTS if scope == STARTS else scope}


def record_wait(kind: str, scope: str, waited: float, holders: int | None,
                limit: int | None, providers: Providers | None) -> None:
    """Report one finished wait of ``kind`` for ``scope``."""
    with contextlib.suppress(Exception):
        tel = get_telemetry(*(providers or (None, None)))
        attributes = {ATTR_FLEET_KIND: kind, **_scope_attributes(scope)}
        tel.record(tel.fleet_wait_duration, waited, attributes)
        if holders is not None:
            tel.record(tel.fleet_holders, holders, attributes)
        if limit is not None:
            tel.record(tel.fleet_limit, limit, attributes)
        span = trace.get_current_span()
        if span.is_recording():
            event: dict[str, Any] = {ATTR_FLEET_KIND: kind, ATTR_FLEET_WAITED: waited}
            if holders is not None:
                event[ATTR_FLEET_HOLDERS] = holders
            if limit is not None:
                event[ATTR_FLEET_LIMIT] = limit
            span.add_event(EVENT_FLEET_WAIT, event)
