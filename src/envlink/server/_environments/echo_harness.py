"""``/harness``: OpenEnv 0.10's RFC 005 harness stream, served by an echo harness.

One connection is one harness session. The server sends ``session_started``, then
answers each ``{"type": "message", "content": ...}`` frame with one turn of events:
``llm_request``, ``tool_call`` / ``tool_result`` (the echo environment's
``echo_message``), ``llm_response``, ``text_output``, ``turn_complete``. A frame
that is not valid JSON or not a message gets a recoverable ``protocol_error`` (no
turn starts, the connection stays usable); a failed turn gets a terminal ``error``
event and the session ends, as OpenEnv's server does. Content ``"!fail"`` makes the
turn fail, so that clients can test the terminal path; ``"!drop"`` cuts the connection
mid-turn (after the first event), as a network failure would; ``"!hang"`` starts a
turn that never completes (until the client goes), as a stuck agent's.

Training captures (envlink's extension of the stream, for loop-owning training): the
server advertises ``training_trace: true`` in ``session_started``; each model call's
``llm_response`` carries a ``training_turn`` (OpenEnv's ``TrainingTurn`` fields: the
engine's ``prompt_token_ids``, the sampled ``completion_token_ids`` with their
``per_token_logps``, a ``loss_mask`` over both, the chat ``request`` and ``response``,
and ``metadata`` with the ``sampling`` policy the call ran under); ``turn_complete``
carries the environment's ``reward``. A message frame may carry ``sampling`` (the
trainer's policy), which the echo "model" reports back in its captures. The echo
model's tokens are the UTF-8 bytes of the rendered conversation, so each call's
prompt extends the previous call's prompt and completion exactly.
"""

from __future__ import annotations

import json
import time
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

__all__ = ["DROP_CONTENT", "FAIL_CONTENT", "HANG_CONTENT", "HARNESS_NAME", "serve_harness"]

HARNESS_NAME = "envlink-echo"
#: A message that makes the echo harness's turn fail (terminal ``error``).
FAIL_CONTENT = "!fail"
#: A message whose turn is cut mid-stream: the connection is aborted, no close frame.
DROP_CONTENT = "!drop"
#: A message whose turn never completes: its first event, then nothing.
HANG_CONTENT = "!hang"


def _event(kind: str, **data: Any) -> str:
    return json.dumps({"type": kind, "timestamp": time.time(), "data": data})


def _protocol_error(message: str, code: str) -> str:
    return json.dumps({"type": "protocol_error", "data": {"message": message, "code": code}})


#: The log-probability the echo "model" gives every token it samples.
ECHO_LOGP = -0.25


def _ids(text: str) -> list[int]:
    return list(text.encode())


def _capture(node_id: str, prompt: str, completion: str, messages: list[dict[str, Any]],
             reply: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    """One model call as OpenEnv's ``TrainingTurn``: the prompt is context, the reply trains."""
    prompt_ids, completion_ids = _ids(prompt), _ids(completion)
    return {
        "node_id": node_id, "prompt_token_ids": prompt_ids,
        "completion_token_ids": completion_ids,
        "per_token_logps": [ECHO_LOGP] * len(completion_ids),
        "loss_mask": [0] * len(prompt_ids) + [1] * len(completion_ids),
        "request": {"messages": messages, "tools": None},
        "response": {"choices": [{"message": reply, "finish_reason": "stop"}]},
        "metadata": {"sampling": sampling, "harness": HARNESS_NAME},
    }


def _turn(content: str, *, node: str = "t0", sampling: dict[str, Any] | None = None,
          training: bool = False) -> list[str]:
    """One turn: the model calls ``echo_message``, reads its result, and answers with it."""
    sampling = dict(sampling or {})
    messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
    call = {"id": f"{node}-call", "type": "function",
            "function": {"name": "echo_message", "arguments": json.dumps({"message": content})}}
    first_reply = {"role": "assistant", "content": "", "tool_calls": [call]}
    prompt = f"user: {content}\n"
    first = f"call echo_message({content})\n"
    second_messages = [*messages, first_reply,
                       {"role": "tool", "tool_call_id": call["id"], "content": content}]
    second_prompt = f"{prompt}{first}tool: {content}\n"
    usage = {"input_tokens": len(content), "output_tokens": len(content)}
    first_data: dict[str, Any] = {"content": "", "usage": usage}
    final_data: dict[str, Any] = {"content": content, "usage": usage}
    done: dict[str, Any] = {"response": content, "done": False}
    if training:
        first_data["training_turn"] = _capture(f"{node}.0", prompt, first, messages,
                                               first_reply, sampling)
        final_data["training_turn"] = _capture(
            f"{node}.1", second_prompt, content, second_messages,
            {"role": "assistant", "content": content}, sampling)
        done["reward"] = 1.0
    return [
        _event("llm_request", messages=messages, model=HARNESS_NAME, sampling=sampling),
        _event("llm_response", **first_data),
        _event("tool_call", tool_name="echo_message", arguments={"message": content}),
        _event("tool_result", tool_name="echo_message", result=content, error=None),
        _event("llm_request", messages=second_messages, model=HARNESS_NAME, sampling=sampling),
        _event("llm_response", **final_data),
        _event("text_output", text=content),
        _event("turn_complete", **done),
    ]


async def serve_harness(connection: ServerConnection, session_id: str, *,
                        training_trace: bool = True) -> None:
    """Serve one harness session on an accepted ``/harness`` connection until it ends.

    Args:
        connection: the accepted connection.
        session_id: the session's id (sent in ``session_started``).
        training_trace: whether the turns carry training captures (advertised).
    """
    turns = 0
    try:
        await connection.send(json.dumps({"type": "session_started", "data": {
            "session_id": session_id, "harness": HARNESS_NAME,
            "training_trace": training_trace}}))
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
            if message["content"] == HANG_CONTENT:
                await connection.send(_turn(HANG_CONTENT)[0])
                continue
            if message["content"] == DROP_CONTENT:
                await connection.send(_turn(DROP_CONTENT)[0])
                connection.transport.abort()
                return
            sampling = message.get("sampling")
            turns += 1
            for frame in _turn(message["content"], node=f"{session_id}.{turns}",
                               sampling=sampling if isinstance(sampling, dict) else None,
                               training=training_trace):
                await connection.send(frame)
        await connection.close()
    except ConnectionClosed:
        pass
