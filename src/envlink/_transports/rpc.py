"""The ``POST /mcp`` JSON-RPC request of every WebSocket transport's ``rpc``."""

from __future__ import annotations

import ssl as ssl_module
from collections.abc import Mapping
from typing import Any

from envlink._config import ConnectionOptions
from envlink._transports.base import Endpoint, RpcAnswer
from envlink._transports.http import post_json

__all__ = ["post_rpc"]


async def post_rpc(endpoint: Endpoint, options: ConnectionOptions, method: str,
                   params: Mapping[str, Any], *, request_id: int) -> RpcAnswer:
    """Post one JSON-RPC request to the server's ``/mcp`` with the connection's
    headers, credentials and TLS (every WebSocket transport's ``rpc``)."""
    headers: list[tuple[str, str]] = list(options.headers)
    if endpoint.auth_header is not None and not any(
        k.lower() == "authorization" for k, _ in headers
    ):
        headers.append(("Authorization", endpoint.auth_header))
    if options.user_agent is not None:
        headers.append(("User-Agent", options.user_agent))
    context = (options.ssl or ssl_module.create_default_context()) if endpoint.secure \
        else None
    answer = await post_json(
        endpoint.mcp_url,
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)},
        headers=headers, ssl=context, proxy=options.proxy,
        max_size=options.max_message_size)
    return RpcAnswer(answer.status, answer.body)
