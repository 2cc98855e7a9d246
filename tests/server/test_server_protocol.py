"""The plain OpenEnv wire protocol of the reference server."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from envlink._sansio.protocol import decode_response
from envlink.server import Environment, EnvServer

from ._server_support import RESET, STATE, open_ws, rpc, step, token_of

pytestmark = pytest.mark.timeout(15)


async def test_reset_step_state_answers(server: EnvServer) -> None:
    """reset/step answer observation frames and state answers a state frame, all valid."""
    async with open_ws(server) as ws:
        reset = await rpc(ws, RESET)
        assert reset["type"] == "observation"
        assert set(reset["data"]) == {"observation", "reward", "done"}
        stepped = await rpc(ws, step({"message": "hi"}))
        assert stepped["type"] == "observation"
        assert stepped["data"]["metadata"] == {"original_message": "hi", "step_count": 1}
        state = await rpc(ws, STATE)
        assert state["type"] == "state"
        assert state["data"]["step_count"] == 1
        assert isinstance(state["data"]["episode_id"], str)
        for frame in (reset, stepped, state):
            decode_response(json.dumps(frame))


async def test_close_ends_session_without_answer(server: EnvServer) -> None:
    """{"type":"close"} gets no answer; the server closes normally and destroys the session."""
    async with open_ws(server) as ws:
        await rpc(ws, RESET)
        await ws.send(json.dumps({"type": "close"}))
        with pytest.raises(ConnectionClosed) as info:
            await ws.recv()
        assert info.value.rcvd is not None
        assert info.value.rcvd.code == 1000
    await server.wait_for_disconnect(1)
    assert server.sessions() == []


async def test_disconnect_destroys_plain_session(server: EnvServer) -> None:
    """In plain mode the session dies with the socket."""
    async with open_ws(server) as ws:
        await rpc(ws, RESET)
        assert len(server.sessions()) == 1
    await server.wait_for_disconnect(1)
    assert server.sessions() == []


async def test_invalid_json_answers_and_continues(server: EnvServer) -> None:
    """Bad JSON is answered INVALID_JSON and the session goes on."""
    async with open_ws(server) as ws:
        answer = await rpc(ws, "{not json")
        assert answer["type"] == "error"
        assert answer["data"]["code"] == "INVALID_JSON"
        assert answer["data"]["message"].startswith("Invalid JSON: ")
        assert (await rpc(ws, RESET))["type"] == "observation"


@pytest.mark.parametrize("frame", [{"type": "bogus"}, {"data": {}}, {"type": 5}, {"type": "mcp"}])
async def test_unknown_type(server: EnvServer, frame: dict[str, object]) -> None:
    """Unknown, missing or non-string types are answered UNKNOWN_TYPE and the session goes on."""
    async with open_ws(server) as ws:
        answer = await rpc(ws, frame)
        assert answer["data"]["code"] == "UNKNOWN_TYPE"
        assert answer["data"]["message"].startswith("Unknown message type: ")
        assert (await rpc(ws, STATE))["type"] == "state"


@pytest.mark.parametrize("frame", [
    {"type": "step"},
    {"type": "step", "data": "oops"},
    {"type": "reset", "data": [1]},
    {"type": "state", "data": {}},
    {"type": "close", "data": {}},
    {"type": "reset", "data": {}, "id": "r1"},
    {"type": "step", "data": {"message": "x"}, "traceparent": f"00-{'1' * 32}-{'2' * 16}-01"},
    {"type": "state", "tracestate": "a=b"},
])
async def test_validation_error_in_plain_mode(server: EnvServer, frame: dict[str, object]) -> None:
    """Malformed envelopes and plain-mode extension fields: VALIDATION_ERROR, session goes on."""
    async with open_ws(server) as ws:
        answer = await rpc(ws, frame)
        assert answer["type"] == "error"
        assert answer["data"]["code"] == "VALIDATION_ERROR"
        assert answer["data"]["message"] == "Invalid message"
        assert answer["data"]["errors"]
        assert "id" not in answer
        assert (await rpc(ws, STATE))["type"] == "state"


async def test_extension_field_error_names_the_field(server: EnvServer) -> None:
    """The plain-mode rejection of a request id says the field is forbidden, like pydantic."""
    async with open_ws(server) as ws:
        answer = await rpc(ws, {"type": "reset", "data": {}, "id": "r1"})
        assert answer["data"]["errors"][0]["type"] == "extra_forbidden"
        assert answer["data"]["errors"][0]["loc"] == ["id"]


async def test_invalid_action_is_validation_error(server: EnvServer) -> None:
    """An action the environment's model rejects is VALIDATION_ERROR and nothing is applied."""
    async with open_ws(server) as ws:
        answer = await rpc(ws, step({"unexpected": 1}))
        assert answer["data"]["code"] == "VALIDATION_ERROR"
        state = await rpc(ws, STATE)
        assert state["data"]["step_count"] == 0
    assert server.steps_applied == 0


async def test_execution_error(det_server: EnvServer) -> None:
    """An exception inside the environment is answered EXECUTION_ERROR with its message."""
    async with open_ws(det_server) as ws:
        answer = await rpc(ws, step({"move": 1}))
        assert answer["data"] == {"message": "call reset before step", "code": "EXECUTION_ERROR"}
        assert (await rpc(ws, RESET))["type"] == "observation"


@pytest.mark.parametrize("payload", ["[1, 2]", "42", '"text"', "null"])
async def test_non_object_json_ends_session(server: EnvServer, payload: str) -> None:
    """JSON that is not an object gets SESSION_ERROR and the session ends, as in OpenEnv."""
    async with open_ws(server) as ws:
        answer = await rpc(ws, payload)
        assert answer["data"]["code"] == "SESSION_ERROR"
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    await server.wait_for_disconnect(1)
    assert server.sessions() == []


async def test_binary_frame_ends_session(server: EnvServer) -> None:
    """A binary frame gets SESSION_ERROR and the session ends (OpenEnv reads text only)."""
    async with open_ws(server) as ws:
        await ws.send(b'{"type": "state"}')
        answer = json.loads(await ws.recv())
        assert answer["data"]["code"] == "SESSION_ERROR"
        with pytest.raises(ConnectionClosed):
            await ws.recv()


async def test_factory_error() -> None:
    """A failing environment factory is answered FACTORY_ERROR and the connection closes."""
    def broken() -> Environment:
        raise RuntimeError("no environment today")

    async with EnvServer(env=broken, ping_interval=None) as srv, open_ws(srv) as ws:
        answer = json.loads(await ws.recv())
        assert answer["data"]["code"] == "FACTORY_ERROR"
        assert answer["data"]["message"] == "no environment today"
        with pytest.raises(ConnectionClosed):
            await ws.recv()



async def test_capacity_reached() -> None:
    """Beyond max_sessions a new connection gets CAPACITY_REACHED at once, then is closed."""
    async with EnvServer(env="echo", max_sessions=1, ping_interval=None) as srv:
        async with open_ws(srv) as first:
            await rpc(first, RESET)
            async with open_ws(srv) as second:
                answer = json.loads(await second.recv())
                assert answer["type"] == "error"
                assert answer["data"]["code"] == "CAPACITY_REACHED"
                assert answer["data"]["max_sessions"] == 1
                with pytest.raises(ConnectionClosed):
                    await second.recv()
            assert (await rpc(first, STATE))["type"] == "state"
        await srv.wait_for_disconnect(2)
        async with open_ws(srv) as third:
            assert (await rpc(third, RESET))["type"] == "observation"


async def test_max_message_size() -> None:
    """A message above max_message_size closes the connection with 1009."""
    async with EnvServer(env="echo", max_message_size=1024, ping_interval=None) as srv, \
            open_ws(srv) as ws:
        assert (await rpc(ws, step({"message": "x" * 500})))["type"] == "observation"
        await ws.send(json.dumps(step({"message": "x" * 2000})))
        with pytest.raises(ConnectionClosed) as info:
            await ws.recv()
        assert info.value.rcvd is not None
        assert info.value.rcvd.code == 1009


def _http_get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


async def test_health(server: EnvServer) -> None:
    """GET /health answers 200 with JSON status healthy."""
    status, ctype, body = await asyncio.to_thread(_http_get, server.http_url + "/health")
    assert status == 200
    assert ctype == "application/json"
    assert json.loads(body)["status"] == "healthy"


async def test_other_paths_404(server: EnvServer) -> None:
    """Any path other than /ws and /health is 404, for plain HTTP and for upgrades."""
    status, _, _ = await asyncio.to_thread(_http_get, server.http_url + "/nope")
    assert status == 404
    from websockets.asyncio.client import connect
    with pytest.raises(InvalidStatus) as info:
        async with connect(server.url + "/other", open_timeout=5):
            pass
    assert info.value.response.status_code == 404


def _http_post(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def test_post_mcp_without_detached_sessions_is_a_quiet_method_not_found(
        server: EnvServer, caplog: pytest.LogCaptureFixture) -> None:
    """A POST /mcp (a client probing for detached sessions) on a server that does not
    offer them gets JSON-RPC "method not found", with no failed handshake logged
    (websockets 16 logged one with its traceback, which broke the demo's JSON logs)."""
    assert not server.detached_sessions
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create",
                       "params": {}}).encode()
    with caplog.at_level(logging.INFO, logger="websockets.server"):
        status, answer = await asyncio.to_thread(_http_post, server.http_url + "/mcp", body)
    assert status == 200
    assert json.loads(answer)["error"]["code"] == -32601
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_post_elsewhere_is_a_quiet_404(
        server: EnvServer, caplog: pytest.LogCaptureFixture) -> None:
    """A POST to a path the server does not serve gets 404, logged quietly."""
    with caplog.at_level(logging.INFO, logger="websockets.server"):
        status, _ = await asyncio.to_thread(_http_post, server.http_url + "/nowhere", b"{}")
    assert status == 404
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_reset_kwargs_filtered_by_signature(det_server: EnvServer) -> None:
    """Reset arguments the environment does not accept are dropped, as OpenEnv does."""
    async with open_ws(det_server) as ws:
        answer = await rpc(ws, {"type": "reset", "data": {"seed": 3, "unknown_option": True}})
        assert answer["type"] == "observation"


async def test_default_host_is_loopback() -> None:
    """The server listens on 127.0.0.1 unless told otherwise."""
    srv = EnvServer()
    assert srv.host == "127.0.0.1"


async def test_credentials_never_logged(server: EnvServer,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """Even with websockets debug logging on, Authorization and tokens are redacted."""
    caplog.set_level(logging.DEBUG, logger="websockets.server")
    headers = {"Authorization": "Bearer top-secret-value", "envlink-resume": "resume-secret"}
    async with open_ws(server, extensions=True, headers=headers) as ws:
        await rpc(ws, STATE)
        token = token_of(ws)
    assert token not in caplog.text
    assert "authorization" in caplog.text.lower()  # the header line is there...
    assert "top-secret-value" not in caplog.text  # ...without its value
    assert "resume-secret" not in caplog.text
