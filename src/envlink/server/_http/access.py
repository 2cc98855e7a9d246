"""Who may use the reference server: a bearer token, allowed origins, a connection cap.

Checked on every request but ``/health`` (left open for liveness probes, which
carry no token; it shows counts, never a session id or token), before anything
else is done with it:

- ``auth_token``: ``Authorization: Bearer <token>`` compared in constant time;
  otherwise ``401`` with ``WWW-Authenticate: Bearer``.
- ``allowed_origins``: a request with an ``Origin`` header (every browser sends
  one; programs usually do not) is refused with ``403`` unless its origin is
  listed (``*`` allows any). By default no browser origin is allowed, so a web
  page cannot drive a server on a developer's machine.
- ``max_connections``: connections beyond it are dropped as soon as they are
  accepted (before a byte is read).
"""

from __future__ import annotations

import hmac
import http
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection
    from websockets.http11 import Request, Response

__all__ = ["Access", "capped_connection"]


@dataclass(frozen=True)
class Access:
    """The access rules of one server (see the module docstring)."""

    auth_token: str | None = None
    allowed_origins: tuple[str, ...] = ()

    @classmethod
    def build(cls, auth_token: str | None, allowed_origins: Sequence[str] | None) -> Access:
        """Validated rules.

        Raises:
            ValueError: an empty token or one with whitespace or control characters.
        """
        if auth_token is not None and (not auth_token or any(
                c.isspace() or ord(c) < 0x20 for c in auth_token)):
            raise ValueError("auth_token must be a non-empty string without whitespace")
        origins = tuple(o.strip().rstrip("/") for o in (allowed_origins or ()) if o.strip())
        return cls(auth_token, origins)

    def refuse(self, connection: ServerConnection, request: Request) -> Response | None:
        """The refusal of ``request``, or ``None`` if it may proceed."""
        origin = request.headers.get("Origin")
        if origin is not None and "*" not in self.allowed_origins and (
                origin.rstrip("/") not in self.allowed_origins):
            return connection.respond(http.HTTPStatus.FORBIDDEN, "Origin not allowed.\n")
        if self.auth_token is not None:
            given = request.headers.get("Authorization", "")
            scheme, _, credential = given.partition(" ")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(
                credential.strip().encode(), self.auth_token.encode())
            if not ok:
                response = connection.respond(http.HTTPStatus.UNAUTHORIZED,
                                              "A bearer token is required.\n")
                response.headers["WWW-Authenticate"] = 'Bearer realm="envlink"'
                return response
        return None


def capped_connection(base: type[ServerConnection], max_connections: int | None
                      ) -> type[ServerConnection]:
    """``base``, dropping each connection accepted beyond ``max_connections``."""
    if max_connections is None:
        return base
    cap: int = max_connections

    class Capped(base):  # type: ignore[valid-type, misc]
        # Counted here, not from websockets' internals: every accepted TCP connection.
        open_count = 0
        refused_count = 0

        def connection_made(self, transport: Any) -> None:
            cls = type(self)
            cls.open_count += 1
            self._counted = True
            super().connection_made(transport)
            if cls.open_count > cap:
                cls.refused_count += 1
                transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            if getattr(self, "_counted", False):
                self._counted = False
                type(self).open_count -= 1
            super().connection_lost(exc)

    Capped.__name__ = Capped.__qualname__ = f"Capped{base.__name__}"
    return Capped
