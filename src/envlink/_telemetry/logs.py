"""Structured logging for envlink: trace-correlated structlog loggers.

Library code logs through :func:`get_logger`, which never configures structlog:
configuration belongs to the application. Until the application configures
structlog, only warnings and errors are emitted (structlog's default
configuration would print every debug line on stdout), as the standard
library's last-resort handler does for ``logging``. So that every line logged while a
span is active carries ``trace_id`` and ``span_id`` whatever the application's
structlog configuration (including structlog's default one), the logger binds
them itself at each call; with no active span that is one context-variable read.

structlog itself is imported on first need, not with envlink: a debug or info
line logged while structlog has never been imported is dropped without importing
it (nothing can have configured it), so a client that only logs its connects
never loads structlog.

Applications that log through structlog themselves add :func:`add_trace_context`
to their processor chain to get the same two keys on their own lines;
:func:`configure_logging` is a ready-made configuration for scripts and the demo
(JSON in production, readable console output in a terminal).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

from opentelemetry import trace

__all__ = [
    "LOGGER_NAME",
    "EnvlinkLogger",
    "add_trace_context",
    "configure_logging",
    "get_logger",
    "trace_context",
]

#: Name of the logger envlink's library code logs to.
LOGGER_NAME = "envlink"

_QUIET_UNCONFIGURED = frozenset({"debug", "info"})
_TRACE_ID = "trace_id"
_SPAN_ID = "span_id"


def trace_context() -> dict[str, str]:
    """``trace_id`` and ``span_id`` (lower-case hex) of the active span, or ``{}``.

    Returns:
        ``{"trace_id": <32 hex digits>, "span_id": <16 hex digits>}`` while a
        valid span is current in this context, else an empty dict.
    """
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {_TRACE_ID: format(ctx.trace_id, "032x"), _SPAN_ID: format(ctx.span_id, "016x")}


def add_trace_context(
    logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: add ``trace_id`` and ``span_id`` of the active span.

    Keys already present (bound by envlink's own loggers, or by the caller) are
    left alone, so the ids always name the span that was current when the line
    was logged. Without an active span the event is returned unchanged.

    Args:
        logger: the wrapped logger (unused).
        method_name: the log method's name (unused).
        event_dict: the event being processed.

    Returns:
        ``event_dict``, with the two keys added when a span is active.
    """
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        if _TRACE_ID not in event_dict:
            event_dict[_TRACE_ID] = format(ctx.trace_id, "032x")
        if _SPAN_ID not in event_dict:
            event_dict[_SPAN_ID] = format(ctx.span_id, "016x")
    return event_dict


class EnvlinkLogger:
    """A structlog logger that adds the active span's ids to every event it logs.

    It delegates to the logger that structlog's current configuration produces,
    so the application's processors, level filtering and output all apply.
    """

    __slots__ = ("_bound", "_initial", "_name")

    def __init__(self, logger: Any = None, *, name: str = LOGGER_NAME,
                 initial_values: dict[str, Any] | None = None) -> None:
        # ``logger`` None: structlog's logger ``name`` is made (and structlog
        # imported) on first use.
        self._bound = logger
        self._name = name
        self._initial = initial_values or {}

    @property
    def _logger(self) -> Any:
        if self._bound is None:
            import structlog

            self._bound = structlog.get_logger(self._name, **self._initial)
        return self._bound

    def bind(self, **new_values: Any) -> EnvlinkLogger:
        """A new logger with ``new_values`` bound to every event."""
        return EnvlinkLogger(self._logger.bind(**new_values))

    def unbind(self, *keys: str) -> EnvlinkLogger:
        """A new logger without ``keys``; raises ``KeyError`` if one is not bound."""
        return EnvlinkLogger(self._logger.unbind(*keys))

    def try_unbind(self, *keys: str) -> EnvlinkLogger:
        """A new logger without ``keys``, ignoring keys that are not bound."""
        return EnvlinkLogger(self._logger.try_unbind(*keys))

    def new(self, **new_values: Any) -> EnvlinkLogger:
        """A new logger with its context replaced by ``new_values``."""
        return EnvlinkLogger(self._logger.new(**new_values))

    def _log(self, method: str, event: str, kw: dict[str, Any]) -> Any:
        if method in _QUIET_UNCONFIGURED and "structlog" not in sys.modules:
            return None  # never imported, so not configured: dropped, as below
        import structlog

        logger = self._logger
        if not structlog.is_configured():
            # Like the stdlib's last-resort handler: an application that never set
            # up structlog sees envlink's warnings and errors, on stderr, and not its
            # chatter on stdout (which may be its own output channel).
            if method in _QUIET_UNCONFIGURED:
                return None
            logger = structlog.wrap_logger(
                structlog.PrintLogger(sys.stderr),
                processors=structlog.get_config()["processors"],
            )
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            kw.setdefault(_TRACE_ID, format(ctx.trace_id, "032x"))
            kw.setdefault(_SPAN_ID, format(ctx.span_id, "016x"))
        try:
            return getattr(logger, method)(event, **kw)
        except Exception:  # a broken log pipeline must never break a call
            return None

    def debug(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at debug level."""
        return self._log("debug", event, kw)

    def info(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at info level."""
        return self._log("info", event, kw)

    def warning(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at warning level."""
        return self._log("warning", event, kw)

    warn = warning

    def error(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at error level."""
        return self._log("error", event, kw)

    def critical(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at critical level."""
        return self._log("critical", event, kw)

    def exception(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at error level with the current exception's traceback."""
        kw.setdefault("exc_info", True)
        return self._log("error", event, kw)

    def msg(self, event: str, **kw: Any) -> Any:
        """Log ``event`` at info level (structlog's ``msg`` alias)."""
        return self._log("info", event, kw)


def get_logger(name: str = LOGGER_NAME, **initial_values: Any) -> EnvlinkLogger:
    """The logger envlink's library code uses; it never configures structlog.

    Args:
        name: the logger name passed to ``structlog.get_logger``.
        **initial_values: key-value pairs bound to every event.

    Returns:
        An :class:`EnvlinkLogger` whose events carry ``trace_id``/``span_id``
        whenever a span is active.
    """
    return EnvlinkLogger(name=name, initial_values=initial_values)


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def configure_logging(
    json: bool | None = None,
    *,
    level: int | str = logging.INFO,
    stream: TextIO | None = None,
) -> None:
    """Configure structlog for an application or script (never called by the library).

    Every line gets a UTC ISO timestamp, its level, bound context variables and
    the active span's ``trace_id``/``span_id``.

    Args:
        json: ``True`` for one JSON object per line (production), ``False`` for
            readable console output; ``None`` picks console output when
            ``stream`` is a terminal, JSON otherwise.
        level: minimum level logged, as a :mod:`logging` level or a name
            (``"debug"``, ``"info"``, ...).
        stream: where lines are written (default: ``sys.stderr``).

    Raises:
        ValueError: ``level`` is not a known level name.
    """
    import structlog

    out = stream if stream is not None else sys.stderr
    if isinstance(level, str):
        try:
            level = _LEVELS[level.lower()]
        except KeyError:
            raise ValueError(
                f"unknown log level {level!r}; expected one of {', '.join(_LEVELS)}"
            ) from None
    if json is None:
        isatty = getattr(out, "isatty", None)
        json = not (callable(isatty) and isatty())
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        add_trace_context,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if json:
        processors += [
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(),
        ]
    else:
        processors += [
            structlog.dev.set_exc_info,
            structlog.dev.ConsoleRenderer(colors=_wants_colour(out)),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        context_class=dict,
        cache_logger_on_first_use=False,
    )


def _wants_colour(out: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(out, "isatty", None)
    return bool(callable(isatty) and isatty())
