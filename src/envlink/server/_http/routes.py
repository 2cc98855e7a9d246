"""The plain-HTTP side of the reference server: what OpenEnv 0.10's tools read.

``openenv validate --url`` (and OpenEnv's web tooling) expects, beside ``/ws``:
``GET /openapi.json`` with ``info.version``, ``GET /metadata`` (name and
description), ``GET /schema`` (action, observation and state JSON schemas),
``POST /mcp`` answering JSON-RPC, and the simulation-mode endpoints ``POST /reset``,
``POST /step`` and ``GET /state`` listed in the OpenAPI paths. Like OpenEnv's, the
HTTP ``reset``/``step``/``state`` are stateless: each builds a fresh environment,
answers, and discards it (episodes live on ``/ws``).

Pure: no sockets. :mod:`envlink.server._http.handshake` routes a request here and
writes the :class:`HttpReply` back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from envlink._config import is_int
from envlink.server._environments.environment import (
    ActionRejectedError,
    EnvironmentFactory,
    StepResult,
    accepted_kwargs,
)
from envlink.server._frames import validation_error

__all__ = ["API_VERSION", "ROUTES", "TASK_ROUTES", "HttpReply", "describe_metadata",
           "describe_schema", "environment_name", "http_reset", "http_state", "http_step",
           "openapi_document", "task_api"]

#: The OpenEnv HTTP API version the server implements (``openenv-http/1.x``).
API_VERSION = "1.0.0"

_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
_STATE_SCHEMA: dict[str, Any] = {
    "title": "State", "type": "object", "additionalProperties": True,
    "properties": {"episode_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                   "step_count": {"type": "integer", "minimum": 0}},
}
_OBSERVATION_SCHEMA: dict[str, Any] = {
    "title": "Observation", "type": "object", "additionalProperties": True,
    "properties": {"done": {"type": "boolean"},
                   "reward": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                   "metadata": {"type": "object"}},
}


@dataclass(frozen=True)
class HttpReply:
    """An HTTP answer: status and a JSON-serialisable body."""

    status: int
    body: Any

    def encode(self) -> bytes:
        """The body as compact JSON bytes."""
        return json.dumps(self.body, separators=(",", ":")).encode()


def describe_metadata(factory: EnvironmentFactory, version: str) -> dict[str, Any]:
    """``GET /metadata``: OpenEnv's ``EnvironmentMetadata`` for the served environment.

    An environment may define ``metadata() -> dict``; otherwise the name and the
    first docstring line of its class are used.
    """
    env = factory()
    described = _optional(env, "metadata")
    cls = type(env)
    doc = (cls.__doc__ or "").strip().splitlines()
    base: dict[str, Any] = {
        "name": cls.__name__.removesuffix("Environment") or cls.__name__,
        "description": doc[0] if doc else f"{cls.__name__} served by envlink",
        "readme_content": None, "version": version, "author": None,
        "documentation_url": None,
    }
    if isinstance(described, Mapping):
        base.update(described)
    return base


def describe_schema(factory: EnvironmentFactory) -> dict[str, Any]:
    """``GET /schema``: JSON schemas of the action, observations and state.

    An environment may define ``schema() -> dict`` with any of ``action``,
    ``observation``, ``reset_observation`` and ``state``; the rest are generic.
    """
    described = _optional(factory(), "schema")
    schema: dict[str, Any] = {"action": dict(_OBJECT, title="Action"),
                              "observation": _OBSERVATION_SCHEMA,
                              "reset_observation": _OBSERVATION_SCHEMA,
                              "state": _STATE_SCHEMA}
    if isinstance(described, Mapping):
        schema.update({k: v for k, v in described.items() if isinstance(v, dict)})
    return schema


def http_reset(factory: EnvironmentFactory, body: Any) -> HttpReply:
    """``POST /reset``: a fresh environment's first observation (OpenEnv's ``ResetResponse``)."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        return _unprocessable("the reset body must be a JSON object")
    return _run(factory, lambda env: env.reset(**accepted_kwargs(env.reset, body)))


def http_step(factory: EnvironmentFactory, body: Any) -> HttpReply:
    """``POST /step``: one action applied to a fresh environment (``{"action": {...}}``)."""
    if not isinstance(body, dict) or not isinstance(body.get("action"), dict):
        return _unprocessable("the step body must be a JSON object with an 'action' object")
    action = dict(body["action"])
    return _run(factory, lambda env: env.step(action))


def http_state(factory: EnvironmentFactory) -> HttpReply:
    """``GET /state``: a fresh environment's state."""
    try:
        state = dict(factory().state())
        json.dumps(state)
    except Exception as exc:
        return HttpReply(500, {"detail": str(exc) or type(exc).__name__})
    return HttpReply(200, state)


def openapi_document(title: str, version: str = API_VERSION) -> dict[str, Any]:
    """``GET /openapi.json``: the HTTP API, in simulation mode (``/reset``, ``/step``...)."""
    def op(summary: str, tag: str, *, body: bool = False) -> dict[str, Any]:
        operation: dict[str, Any] = {
            "summary": summary, "tags": [tag],
            "responses": {"200": {"description": "Successful Response",
                                  "content": {"application/json": {"schema": _OBJECT}}}}}
        if body:
            operation["requestBody"] = {"content": {"application/json": {"schema": _OBJECT}}}
        return operation

    paths: dict[str, dict[str, Any]] = {}
    for (method, path), (summary, tag) in ROUTES.items():
        paths.setdefault(path, {})[method.lower()] = op(summary, tag, body=method == "POST")
    return {"openapi": "3.1.0",
            "info": {"title": title, "version": version,
                     "description": "OpenEnv-compatible environment server (envlink). "
                                    "Episodes run over the WebSocket endpoint /ws."},
            "paths": paths}


#: ``(method, path) -> (summary, tag)`` of every plain-HTTP route the server answers.
ROUTES: Mapping[tuple[str, str], tuple[str, str]] = {
    ("GET", "/openapi.json"): ("This document", "Schema"),
    ("GET", "/health"): ("Health check", "Health"),
    ("GET", "/metadata"): ("Get environment metadata", "Environment Info"),
    ("GET", "/schema"): ("Get all JSON schemas", "Schema"),
    ("POST", "/reset"): ("Reset a fresh environment", "Environment Control"),
    ("POST", "/step"): ("Step a fresh environment", "Environment Control"),
    ("GET", "/state"): ("Get a fresh environment's state", "State Management"),
    ("POST", "/mcp"): ("MCP JSON-RPC endpoint", "MCP"),
}


#: OpenEnv 0.10's Task API below ``/{env_name}/``: route -> (HTTP method, environment
#: method, the body fields it takes in order).
TASK_ROUTES: Mapping[str, tuple[str, str, tuple[str, ...]]] = {
    "splits": ("GET", "list_splits", ()),
    "tasks": ("POST", "list_tasks", ("split",)),
    "num_tasks": ("POST", "num_tasks", ("split",)),
    "task": ("POST", "get_task", ("split", "index")),
    "task_range": ("POST", "get_task_range", ("split", "start", "stop")),
}
_TASK_DEFAULTS: Mapping[str, Any] = {"split": "", "index": 0, "start": 0, "stop": 20}


def environment_name(factory: EnvironmentFactory) -> str:
    """The served environment's name in Task API paths (``/list_environments``)."""
    return str(describe_metadata(factory, "")["name"]).lower()


def task_api(factory: EnvironmentFactory, method: str, path: str,
             body: Any) -> HttpReply | None:
    """OpenEnv 0.10's Task API: ``GET /list_environments``, ``GET /{env}/splits`` and
    ``POST /{env}/tasks | num_tasks | task | task_range``.

    Answers as OpenEnv does: 501 when the environment has no such method, 400 for a
    task index outside the split, 404 for another environment's name. Returns ``None``
    for a path that is not the Task API's.
    """
    if path == "/list_environments":
        if method != "GET":
            return _not_allowed()
        return HttpReply(200, [environment_name(factory)])
    parts = path.strip("/").split("/")
    if len(parts) != 2 or parts[1] not in TASK_ROUTES:
        return None  # decided before any environment is built for the name
    verb, attribute, fields = TASK_ROUTES[parts[1]]
    if method != verb:
        return _not_allowed()
    name = environment_name(factory)
    if parts[0] != name:
        return HttpReply(404, {"detail": f"unknown environment {parts[0]!r}"})
    if verb == "POST" and not isinstance(body, dict):
        return _unprocessable("the body must be a JSON object")
    args = [(body or {}).get(field, _TASK_DEFAULTS[field]) for field in fields]
    if not all(isinstance(a, str) if f == "split" else is_int(a)
               for f, a in zip(fields, args, strict=True)):
        return _unprocessable(f"{parts[1]} takes {', '.join(fields)}: a string and integers")
    env = factory()
    call = getattr(env, attribute, None)
    if not callable(call):
        return HttpReply(501, {"detail": f"{attribute} is not supported for this environment"})
    try:
        result = call(*args)
        json.dumps(result)
    except IndexError:
        return HttpReply(400, {"detail": "Invalid task index"})
    except ValueError as exc:
        return HttpReply(400, {"detail": str(exc)})
    except Exception as exc:
        return HttpReply(500, {"detail": str(exc) or type(exc).__name__})
    if attribute == "list_splits":
        return HttpReply(200, [_split_entry(split) for split in result])
    key = {"list_tasks": "tasks", "num_tasks": "num_tasks", "get_task": "task",
           "get_task_range": "tasks"}[attribute]
    answer: dict[str, Any] = {key: result}
    if attribute == "list_tasks":
        answer["env_name"] = name
    return HttpReply(200, answer)


def _split_entry(split: Any) -> Any:
    # OpenEnv's normalisation: a name becomes {"name", "type"}.
    if isinstance(split, str):
        kind = split if split in {"train", "validation", "test"} else "validation"
        return {"name": split, "type": kind}
    return split




def _not_allowed() -> HttpReply:
    return HttpReply(405, {"detail": "Method Not Allowed"})


def _optional(env: object, name: str) -> Any:
    method = getattr(env, name, None)
    if not callable(method):
        return None
    try:
        return method()
    except Exception:
        return None


def _run(factory: EnvironmentFactory, call: Callable[[Any], StepResult]) -> HttpReply:
    try:
        result = call(factory())
        if not isinstance(result, StepResult):
            raise TypeError(f"environment returned {type(result).__name__}, expected StepResult")
        data = result.to_wire()
        data.pop("metadata", None)  # OpenEnv's HTTP answers carry it inside the observation
        json.dumps(data)
    except ValidationError as exc:
        return HttpReply(422, {"detail": validation_error(exc)["errors"]})
    except ActionRejectedError as exc:
        return _unprocessable(str(exc))
    except Exception as exc:
        return HttpReply(500, {"detail": str(exc) or type(exc).__name__})
    return HttpReply(200, data)


def _unprocessable(message: str) -> HttpReply:
    return HttpReply(422, {"detail": message})
