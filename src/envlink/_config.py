"""Client configuration that does no I/O: timeouts and connection options, the checks
of every option, and what envlink shows of a URL or a header (never a credential)."""

from __future__ import annotations

import enum
import math
import numbers
import re
from dataclasses import dataclass, fields
from typing import Any, Final, TypeGuard, cast
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "UNSET",
    "CheckedTimeout",
    "ConnectionOptions",
    "Timeout",
    "TimeoutTypes",
    "UnsetType",
    "call_seconds",
    "check_count",
    "check_number",
    "check_timeout",
    "is_int",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "REDACTED",
    "SENSITIVE_HEADERS",
    "UNPARSABLE",
    "is_sensitive_name",
    "redact_text",
    "redact_url",
]


class UnsetType(enum.Enum):
    """Type of :data:`UNSET`: "not given", as opposed to ``None`` ("no limit")."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = UnsetType.UNSET


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` and not a ``bool`` (``True`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_number(
    value: object,
    name: str,
    *,
    integer: bool = False,
    above: float | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    finite: bool = False,
    optional: bool = False,
    expected: str | None = None,
    kind: str | None = None,
    mistyped: type[Exception] = TypeError,
) -> None:
    """Refuse a number a caller gave that is mistyped or out of bounds: the one validator.

    A bool is never a number here, and NaN is never within bounds. Every check of a
    timeout, delay, limit, size or count in envlink goes through this function, so
    they all refuse the same things.

    Args:
        value: what the caller passed.
        name: the parameter's name, for the message.
        integer: require an integral number; else any real number.
        above: the value must be greater than this.
        minimum: the value must be at least this.
        maximum: the value must be at most this.
        finite: refuse infinity too.
        optional: let ``None`` through.
        expected: what the value must be, for the out-of-bounds message
            (``"{name} must be {expected}, got {value!r}"``); by default it is said
            from the bounds (``"positive"``, ``">= 1"``, ``"within 0..1"``).
        kind: what the value must be, for the wrong-type message
            (``"{name} must be {kind}, got {type} {value!r}"``); by default
            ``"an int"`` or ``"a number"``.
        mistyped: the error for a value of the wrong type; a ``ValueError`` there
            gives the out-of-bounds message, for parameters that never told the two apart.

    Raises:
        TypeError: ``value`` is not a number (or not an int), unless ``mistyped`` says
            otherwise.
        ValueError: ``value`` is NaN, out of bounds, or infinite with ``finite``.
    """
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(
            value, numbers.Integral if integer else numbers.Real):
        if mistyped is TypeError:
            if kind is None:
                kind = ("an int" if integer else "a number") + (" or None" if optional else "")
            raise TypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
        raise mistyped(_out_of_bounds(value, name, above, minimum, maximum, optional, expected))
    number = float(value)
    if (math.isnan(number) or (above is not None and not number > above)
            or (minimum is not None and not number >= minimum)
            or (maximum is not None and not number <= maximum)
            or (finite and math.isinf(number))):
        raise ValueError(_out_of_bounds(value, name, above, minimum, maximum, optional,
                                        expected))


def _out_of_bounds(value: object, name: str, above: float | None, minimum: float | None,
                   maximum: float | None, optional: bool, expected: str | None) -> str:
    if expected is None:
        if minimum is not None and maximum is not None:
            expected = f"within {minimum:g}..{maximum:g}"
        elif above == 0:
            expected = "positive"
        elif above is not None:
            expected = f"> {above:g}"
        elif minimum is not None:
            expected = f">= {minimum:g}"
        else:
            expected = f"<= {maximum:g}"
        if optional:
            expected += " or None"
    return f"{name} must be {expected}, got {value!r}"


def check_timeout(value: object, name: str = "timeout", *, allow_zero: bool = False
                  ) -> float | None:
    """Validate a duration in seconds given by a caller; ``None`` means no limit.

    Args:
        value: what the caller passed.
        name: the parameter's name, for the message.
        allow_zero: accept ``0`` (e.g. a grace period), not only positive values.

    Returns:
        the duration as a float, or ``None``.

    Raises:
        TypeError: not a real number (``"5"``, ``True``: a bool is not a duration).
        ValueError: NaN, negative, or zero unless ``allow_zero``.
    """
    if value is None:
        return None
    if type(value) is float and (value > 0 or (allow_zero and value == 0)):
        return value  # the common case, per bridged call: no ABC check (NaN fails both)
    check_number(value, name, above=None if allow_zero else 0,
                 minimum=0 if allow_zero else None, kind="a number of seconds or None",
                 expected=f"a {'>= 0' if allow_zero else 'positive'} number of seconds or None")
    return float(cast("numbers.Real", value))


class CheckedTimeout(float):
    """A caller's ``timeout=`` that a blocking facade has checked already.

    The facade checks a blocking call's ``timeout=`` once, in the caller's thread, and
    hands it to the async method as this type, which :func:`call_seconds` takes as it
    is: one check per call, wherever the call came in.
    """

    __slots__ = ()


def call_seconds(timeout: float | UnsetType | None, default: float | None) -> float | None:
    """The deadline in seconds of one call given ``timeout=``.

    Args:
        timeout: what the caller passed; ``UNSET`` for ``default``; a
            :class:`CheckedTimeout` (or ``None``) is taken as it is, anything else checked.
        default: the deadline when ``timeout`` is not given.

    Raises:
        TypeError, ValueError: as :func:`check_timeout`.
    """
    if timeout is UNSET:
        return default
    if timeout is None or type(timeout) is CheckedTimeout:
        return timeout
    return check_timeout(timeout)


def check_count(value: object, name: str, *, minimum: int = 0) -> int:
    """Validate a whole number given by a caller (a bool is not a count).

    Raises:
        TypeError: not an ``int``.
        ValueError: below ``minimum``.
    """
    check_number(value, name, integer=True, minimum=minimum)
    return int(cast("numbers.Integral", value))


_DEFAULT_CONNECT = 10.0
_DEFAULT_CALL = 60.0
_DEFAULT_CLOSE = 5.0
_DEFAULT_PROBE = 2.0
_DEFAULT_RELEASE = 5.0
_TIMEOUT_FIELDS = ("connect", "call", "close", "probe", "release")


class Timeout:
    """Deadlines per phase, httpx-style: one default plus per-phase overrides. Immutable.

    ``Timeout(5.0)`` sets every call phase to 5 s; ``Timeout(5.0, connect=10.0)``
    overrides one phase; ``None`` means no limit. Call phases:

    - ``connect``: opening the WebSocket (TCP, TLS, upgrade handshake), per attempt;
    - ``call``: a whole protocol call (queue wait, reconnects, recovery, the answer);
    - ``close``: the closing handshake.

    Housekeeping waits, with defaults of their own (``default`` does not set them,
    and ``None`` is not allowed: they must end):

    - ``probe``: the health-check ping sent before reusing a connection on which a
      call timed out (never longer than ``ConnectionOptions.ping_timeout``);
    - ``release``: ending, in the background, a detached server session the client
      gives up on (so it does not hold a server slot for its whole grace window).

    Args:
        default: value for every phase not given explicitly.
        connect: connect phase override.
        call: call phase override.
        close: close phase override.
        probe: the probe wait (default 2 s).
        release: the release wait (default 5 s).
    """

    __slots__ = ("call", "close", "connect", "probe", "release")
    connect: float | None
    call: float | None
    close: float | None
    probe: float
    release: float

    def __init__(
        self,
        default: float | UnsetType | None = UNSET,
        *,
        connect: float | UnsetType | None = UNSET,
        call: float | UnsetType | None = UNSET,
        close: float | UnsetType | None = UNSET,
        probe: float = _DEFAULT_PROBE,
        release: float = _DEFAULT_RELEASE,
    ) -> None:
        def pick(value: float | UnsetType | None, fallback: float) -> float | None:
            if value is not UNSET:
                chosen = value
            elif default is not UNSET:
                chosen = default
            else:
                chosen = fallback
            return check_timeout(chosen, "timeout")

        for name, wait in (("probe", probe), ("release", release)):
            check_number(wait, name, above=0, mistyped=ValueError,
                         expected="a positive number of seconds")
        self.__setstate__((pick(connect, _DEFAULT_CONNECT), pick(call, _DEFAULT_CALL),
                           pick(close, _DEFAULT_CLOSE), float(probe), float(release)))

    @classmethod
    def coerce(cls, value: TimeoutTypes) -> Timeout:
        """Accept a :class:`Timeout`, a number (every phase) or ``None`` (no limits)."""
        if isinstance(value, Timeout):
            return value
        return cls(value)

    def _key(self) -> tuple[float | None, ...]:
        return (self.connect, self.call, self.close, self.probe, self.release)

    def __setattr__(self, name: str, value: object) -> None:
        # A value, as ClientConfig that holds it: clients built from one share it.
        raise AttributeError(f"Timeout is immutable: build another (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Timeout is immutable (cannot delete {name!r})")

    def __getstate__(self) -> tuple[float | None, ...]:
        return self._key()

    def __setstate__(self, state: tuple[float | None, ...]) -> None:
        for name, value in zip(_TIMEOUT_FIELDS, state, strict=True):
            object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timeout) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Timeout(connect={self.connect}, call={self.call}, close={self.close}, "
                f"probe={self.probe}, release={self.release})")


TimeoutTypes = Timeout | float | None

#: OpenEnv's own client and server accept messages up to 100 MiB (large observations
#: such as screenshots); websockets' default of 1 MiB would reject them.
DEFAULT_MAX_MESSAGE_SIZE = 100 * 1024 * 1024


@dataclass(frozen=True)
class ConnectionOptions:
    """How each WebSocket connection is opened and kept healthy.

    Attributes:
        headers: extra handshake headers (e.g. ``Authorization``); never logged.
        ping_interval: seconds between keepalive pings (``None`` disables them).
        ping_timeout: seconds to wait for a pong before the peer is declared dead;
            a dead peer is detected within ``ping_interval + ping_timeout``.
        max_message_size: largest accepted frame in bytes.
        max_message_values: most JSON values a received frame may hold (counted
            before parsing, which bounds its parsed memory: a frame's length alone
            does not, ``[{},{},...]`` costs ~24 times its size); ``None``: no bound.
        compression: ``None`` (default: it costs latency on large observations) or
            ``"deflate"``.
        ssl: an ``ssl.SSLContext`` for ``wss://``; by default a verifying one.
        proxy: ``True`` to honour proxy environment variables, ``None`` for none, or a URL.
        user_agent: the ``User-Agent`` header.
        close_timeout: seconds to wait for the peer's close frame once a close has
            started (also after a keepalive timeout): short, so a dead peer is
            reported within ``ping_interval + ping_timeout`` plus this; never longer
            than ``ping_timeout``. The client's own graceful close is bounded by
            ``Timeout.close``.
        last_frame_wait: seconds to wait for a frame the server sent just before
            closing (a server at capacity sends an error frame, then closes): it
            explains the close and must not be lost.
    """

    headers: tuple[tuple[str, str], ...] = ()
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_message_values: int | None = 8 * 1024 * 1024  # _sansio.limits.DEFAULT_MAX_MESSAGE_VALUES
    compression: str | None = None
    ssl: Any = None
    proxy: str | bool | None = True
    user_agent: str | None = None
    close_timeout: float = 1.0
    last_frame_wait: float = 0.05

    def __post_init__(self) -> None:
        check_timeout(self.ping_interval, "ping_interval")
        check_timeout(self.ping_timeout, "ping_timeout")
        check_number(self.close_timeout, "close_timeout", above=0)
        check_number(self.last_frame_wait, "last_frame_wait", minimum=0)
        if self.compression not in (None, "deflate"):
            raise ValueError(f"compression must be None or 'deflate', got {self.compression!r}")
        check_number(self.max_message_size, "max_message_size", integer=True, above=0)
        check_number(self.max_message_values, "max_message_values", integer=True, above=0,
                     optional=True)
        _check_headers(self.headers)
        if self.ssl is not None and (isinstance(self.ssl, bool) or not all(
                hasattr(self.ssl, a) for a in ("wrap_socket", "wrap_bio", "check_hostname"))):
            # Checked by its shape: this module does no I/O and imports no ssl.
            raise TypeError(f"ssl must be an ssl.SSLContext or None, got "
                            f"{type(self.ssl).__name__} {self.ssl!r}")
        # An unsupported proxy scheme is a ConnectError at the first connection (as a
        # proxy read from the environment would be), not refused here.
        if self.proxy is not None and not isinstance(self.proxy, (bool, str)):
            raise TypeError(f"proxy must be a URL, True or None, got {type(self.proxy).__name__}")

    def __repr__(self) -> str:
        # Header values (Authorization...) and proxy credentials never appear.
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "headers":
                value = tuple((k, "REDACTED") for k, _ in value)
            elif f.name == "proxy" and isinstance(value, str):
                value = redact_url(value)
            shown.append(f"{f.name}={value!r}")
        return f"ConnectionOptions({', '.join(shown)})"


# RFC 9110 token characters: what a header name may be made of.
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _check_headers(headers: object) -> None:
    if not isinstance(headers, tuple):
        raise TypeError(f"headers must be a tuple of (name, value) pairs, "
                        f"got {type(headers).__name__}")
    for pair in headers:
        if not (isinstance(pair, tuple) and len(pair) == 2
                and isinstance(pair[0], str) and isinstance(pair[1], str)):
            raise TypeError("headers must be (str, str) pairs")
        name, value = pair
        if not name or not set(name) <= _TOKEN:
            raise ValueError(f"header name {name[:40]!r} is not a valid HTTP token")
        if any(c in value for c in "\r\n\0"):
            # A CR/LF would start a header of its own: refused on every path.
            raise ValueError(f"the value of header {name!r} contains CR, LF or NUL")


# ------------------------------------------------------------------
# The command-line argument types every ``envlink`` command shares (``argparse`` ``type=``),
# with the checks above.
#
# Each turns a string into a number, or raises :class:`argparse.ArgumentTypeError` with
# the reason, which ``argparse`` prints as a usage error (exit status 2).

def _usage_error(message: str) -> Exception:
    # argparse is imported by the commands that parse arguments, not by every client.
    import argparse

    return argparse.ArgumentTypeError(message)


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    value = int(text)
    if value < 1:
        raise _usage_error(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0."""
    value = int(text)
    if value < 0:
        raise _usage_error(f"must not be negative, got {value}")
    return value


def positive_float(text: str) -> float:
    """A number greater than 0 (not NaN)."""
    value = float(text)
    if not value > 0:
        raise _usage_error(f"must be positive, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A number of at least 0 (not NaN)."""
    value = float(text)
    if not value >= 0:
        raise _usage_error(f"must not be negative, got {text}")
    return value


# ------------------------------------------------------------------
# What envlink shows of a URL or a header: never a credential.
#
# Every URL that reaches an error, a log line, a span, a repr or a pool view goes
# through :func:`redact_url`: no userinfo (``user:password@``), and the value of any
# query parameter whose name suggests a secret (``token``, ``key``, ``secret``,
# ``password``, ``auth``, ``sig``, ``session_id``...) replaced by ``REDACTED``.

REDACTED = "REDACTED"

#: Header names whose values are never shown (compared in lower case).
SENSITIVE_HEADERS = frozenset({
    "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key",
    "api-key", "x-auth-token", "x-access-token", "envlink-resume", "envlink-session",
})

_SENSITIVE = re.compile(
    r"(token|key|secret|passw|pwd|auth|sig|credential|session_?id|cookie|bearer|jwt|"
    r"code|ticket|nonce|assertion)", re.IGNORECASE)

# A URL inside free text (an exception's message, a log line).
_URL_IN_TEXT = re.compile(r"\b(?:wss?|https?|socks5h?)://[^\s'\"<>]+", re.IGNORECASE)


def is_sensitive_name(name: str) -> bool:
    """Whether a header or query parameter called ``name`` may carry a secret."""
    return name.lower() in SENSITIVE_HEADERS or _SENSITIVE.search(name) is not None


#: What a URL that cannot be parsed, and might carry a secret, is shown as.
UNPARSABLE = "<unparsable URL>"


def redact_url(url: str) -> str:
    """``url`` without userinfo and with the values of sensitive query parameters redacted.

    A string that is not a URL is returned unchanged (it has nothing to hide); one that
    looks like a URL but cannot be parsed is shown as ``<unparsable URL>`` when it could
    carry userinfo or a query.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return UNPARSABLE if ("@" in url or "?" in url) else url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = netloc.rpartition("@")[2]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_sensitive_name(k) for k, _ in pairs):
            query = "&".join(
                f"{quote(k, safe='')}={REDACTED if is_sensitive_name(k) else quote(v, safe='')}"
                for k, v in pairs)
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (see :func:`redact_url`)."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
