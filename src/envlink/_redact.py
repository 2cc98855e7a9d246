"""What envlink shows of a URL or a header: never a credential.

Every URL that reaches an error, a log line, a span, a repr or a pool view goes
through :func:`redact_url`: no userinfo (``user:password@``), and the value of any
query parameter whose name suggests a secret (``token``, ``key``, ``secret``,
``password``, ``auth``, ``sig``, ``session_id``...) replaced by ``REDACTED``.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

__all__ = ["REDACTED", "SENSITIVE_HEADERS", "UNPARSABLE", "is_sensitive_name", "redact_text",
           "redact_url"]

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
