"""The reference server's plain-HTTP routes: what ``openenv validate`` and OpenEnv's tools read."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from envlink.server import EnvServer
from envlink.server._environments.deterministic import DeterministicEnvironment
from envlink.server._environments.echo import EchoEnvironment
from envlink.server._http.routes import (
    API_VERSION,
    describe_metadata,
    describe_schema,
    http_reset,
    http_state,
    http_step,
    openapi_document,
)

pytestmark = pytest.mark.timeout(15)


def _request(url: str, body: bytes | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            status, raw = int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def test_openapi_lists_the_simulation_mode_routes() -> None:
    """The OpenAPI document has a version and lists /reset, /step and /state (simulation mode)."""
    doc = openapi_document("t")
    assert doc["info"]["version"] == API_VERSION
    assert {"/reset", "/step", "/state", "/metadata", "/schema", "/mcp"} <= set(doc["paths"])
    assert set(doc["paths"]["/step"]) == {"post"}
    assert set(doc["paths"]["/state"]) == {"get"}


def test_metadata_falls_back_to_the_class_docstring() -> None:
    """An environment without ``metadata()`` is described by its class name and docstring."""
    meta = describe_metadata(DeterministicEnvironment, "9.9")
    assert meta["name"] == "Deterministic"
    assert meta["description"].startswith("A walker on a line")
    assert meta["version"] == "9.9"
    assert describe_metadata(EchoEnvironment, "1")["name"] == "echo_env"


def test_schema_uses_the_environment_action_models() -> None:
    """The echo environment's action schema is its pydantic action union; state is generic."""
    schema = describe_schema(EchoEnvironment)
    assert "_EchoAction" in json.dumps(schema["action"])
    assert set(schema["state"]["properties"]) == {"episode_id", "step_count"}
    assert isinstance(describe_schema(DeterministicEnvironment)["action"], dict)


def test_http_reset_step_state_are_stateless_like_openenv() -> None:
    """Each HTTP call runs on a fresh environment; validation errors are 422, failures 500."""
    reset = http_reset(EchoEnvironment, {"episode_id": "e1", "ignored": 1})
    assert reset.status == 200
    assert reset.body["observation"]["echoed_message"] == "Echo environment ready!"
    step = http_step(EchoEnvironment, {"action": {"message": "hey"}})
    assert (step.status, step.body["reward"]) == (200, pytest.approx(0.3))
    assert http_step(EchoEnvironment, {"action": {"nope": 1}}).status == 422
    assert http_step(EchoEnvironment, {"message": "no action"}).status == 422
    assert http_reset(DeterministicEnvironment, {"seed": "x"}).status == 422
    assert http_step(DeterministicEnvironment, {"action": {"move": 1}}).status == 500
    assert http_state(EchoEnvironment).body["step_count"] == 0


async def test_routes_on_the_running_server(server: EnvServer) -> None:
    """The real server answers every route with JSON, and the wrong method with 405."""
    base = server.http_url
    status, doc = await asyncio.to_thread(_request, base + "/openapi.json")
    assert status == 200 and doc["info"]["version"] == API_VERSION
    status, meta = await asyncio.to_thread(_request, base + "/metadata")
    assert status == 200 and meta["name"] == "echo_env"
    status, schema = await asyncio.to_thread(_request, base + "/schema")
    assert status == 200 and {"action", "observation", "state"} <= set(schema)
    status, answer = await asyncio.to_thread(
        _request, base + "/step", json.dumps({"action": {"message": "ab"}}).encode())
    assert status == 200 and answer["observation"]["message_length"] == 2
    status, answer = await asyncio.to_thread(_request, base + "/reset", b"")
    assert status == 200 and answer["done"] is False
    status, _ = await asyncio.to_thread(_request, base + "/reset", b"{not json")
    assert status == 422
    status, _ = await asyncio.to_thread(_request, base + "/state", b"{}")
    assert status == 405
    status, _ = await asyncio.to_thread(_request, base + "/step")
    assert status == 405
    status, answer = await asyncio.to_thread(_request, base + "/mcp", b"{}")
    assert status == 200 and answer["jsonrpc"] == "2.0" and answer["error"]["code"] == -32600
