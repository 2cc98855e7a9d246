"""``/harness``: OpenEnv 0.10's RFC 005 harness stream, served by an echo harness.

One connection is one harness session. The server sends ``session_started``, then
answers each ``{"type": "message", "content": ...}`` frame with one turn of events:
``llm_request``, ``tool_call`` / ``tool_result`` (the echo environment's
``echo_message``), ``llm_response``, ``text_output``, ``turn_complete``. A frame
that is not valid JSON or not a message gets a recoverable ``protocol_error`` (no
turn starts, the connection stays usable); a failed turn gets a terminal ``error``
event and the session ends, as OpenEnv's server does. Content ``"!fail"`` makes the
turn fail, so that clients can test the terminal path.
"""

from __future__ import annotations

import json
import time
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

__all__ = ["HARNESS_NAME", "FAIL_CONTENT", "serve_harness"]

HARNESS_NAME = "envlink-echo"
#: A message that makes the echo harness's turn fail (terminal ``error``).
FAIL_CONTENT = "!fail"


def _event(kind: str, **data: Any) -> str:
    return json.dumps({"type": kind, "timestamp": time.time(), "data": data})


def _protocol_error(message: str, code: str) -> str:
    return json.dumps({"type": "protocol_error", "data": {"message": message, "code": code}})


def _turn(content: str) -> list[str]:
    messages = [{"role": "user", "content": content}]
    return [
        _event("llm_request", messages=messages, model=HARNESS_NAME),
        _event("tool_call", tool_name="echo_message", arguments={"message": content}),
        _event("tool_result", tool_name="echo_message", result=content, error=None),
        _event("llm_response", content=content, usage={"input_tokens": len(content),
                                                       "output_tokens": len(content)}),
        _event("text_output", text=content),
        _event("turn_complete", response=content, done=False),
    ]


async def serve_harness(connection: ServerConnection, session_id: str) -> None:
    """Serve one harness session on an accepted ``/harness`` connection until it ends."""
    try:
        await connection.send(json.dumps({"type": "session_started", "data": {
            "session_id": session_id, "harness": HARNESS_NAME}}))
        async for raw in connection:
            try:
                message = json.loads(raw)
            except ValueError as exc:
                await connection.send(_protocol_error(f"Invalid JSON: {exc}", "INVALID_JSON"))
                continue
            if not isinstance(message, dict) or message.get("type") != "message" or (
                    not isinstance(message.get("content"), str)):
                await connection.send(_protocol_error(
                    "Invalid message: expected {\"type\": \"message\", \"content\": str}",
                    "VALIDATION_ERROR"))
                continue
            if message["content"] == FAIL_CONTENT:
                await connection.send(_event("error", message="harness turn failed",
                                             recoverable=False))
                break
            for frame in _turn(message["content"]):
                await connection.send(frame)
        await connection.close()
    except ConnectionClosed:
        pass
