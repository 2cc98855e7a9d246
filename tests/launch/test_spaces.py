"""Hugging Face Spaces: names, tokens (sent to that host only), and a sleeping Space."""

from __future__ import annotations

from pathlib import Path

import pytest

from envlink import (
    GenericEnvClient,
    NotReadyError,
    ReconnectPolicy,
    SpaceNotAwakeError,
    hf_space_subdomain,
)
from envlink._launch.lifecycle import override_space_urls
from envlink._launch.spaces import hf_token, space_url
from envlink.server import EnvServer

from .._space_standin import SpaceStandIn

pytestmark = pytest.mark.timeout(20)

TOKEN = "hf_secretTOKEN123"


def test_space_names_resolve_as_the_hub_does() -> None:
    """`owner/space` maps to https://<lowercased, non-alphanumerics as '-'>.hf.space."""
    assert hf_space_subdomain("OpenEnv/echo_env") == "openenv-echo-env"
    assert space_url("openenv/echo.env") == "https://openenv-echo-env.hf.space"
    client = GenericEnvClient("openenv/echo_env", token=TOKEN)
    assert client.base_url == "https://openenv-echo-env.hf.space"
    with pytest.raises(ValueError, match="owner/space"):
        space_url("not a space")


def test_token_comes_from_env_then_token_file(tmp_path: Path) -> None:
    """HF_TOKEN wins; otherwise $HF_HOME/token; otherwise nothing."""
    (tmp_path / "token").write_text(" file-token \n")
    assert hf_token({"HF_TOKEN": "env-token", "HF_HOME": str(tmp_path)}) == "env-token"
    assert hf_token({"HF_HOME": str(tmp_path)}) == "file-token"
    assert hf_token({"HF_HOME": str(tmp_path / "missing")}) is None


def test_token_never_in_repr_or_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Space client built from HF_TOKEN never shows the token in its reprs."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    client = GenericEnvClient("owner/private-space")
    assert TOKEN not in repr(client) and TOKEN not in repr(client._target)
    assert TOKEN not in client.ws_url and TOKEN not in str(client.base_url)


def test_no_token_for_other_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_TOKEN is attached only to a Space's own host, never to another server."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    plain = GenericEnvClient("http://127.0.0.1:9")
    assert plain._target.headers is None
    space = GenericEnvClient("https://owner-space.hf.space")
    assert space._target.headers == {"Authorization": f"Bearer {TOKEN}"}
    mine = GenericEnvClient("https://owner-space.hf.space", headers={"Authorization": "x"})
    assert mine._target.headers == {"Authorization": "x"}


async def test_sleeping_space_is_waited_for_then_used(server: EnvServer) -> None:
    """A Space answering 503, then its HTML page, then ready, is waited for and used; the
    token reaches it on every request, the WebSocket upgrade included."""
    async with SpaceStandIn(server.port, script=(503, 200)) as space:
        with override_space_urls({"owner/sleepy": space.url}):
            client = GenericEnvClient("owner/sleepy", token=TOKEN,
                                      reconnect=ReconnectPolicy(max_elapsed=10.0))
        async with client:
            result = await client.step({"message": "awake"})
        assert result.observation["echoed_message"] == "awake"
        assert space.scripted_left == 0
        assert len(space.requests) >= 4  # 503, page, healthy, upgrade
        assert {auth for _line, auth in space.requests} == {f"Bearer {TOKEN}"}
        assert any(line.startswith("GET /ws") for line, _auth in space.requests)


async def test_space_that_does_not_wake_gets_a_typed_error(server: EnvServer) -> None:
    """Past the deadline, connecting raises SpaceNotAwakeError saying the Space did not wake."""
    async with SpaceStandIn(server.port, script=(503,), forever=True) as space:
        with override_space_urls({"owner/asleep": space.url}):
            client = GenericEnvClient("owner/asleep", token=TOKEN,
                                      reconnect=ReconnectPolicy(max_elapsed=0.3))
        with pytest.raises(SpaceNotAwakeError, match="did not wake") as info:
            await client.connect()
        await client.close()
    assert isinstance(info.value, NotReadyError) and info.value.last_status == 503
    assert "owner/asleep" in str(info.value) and TOKEN not in str(info.value)
    assert not any(line.startswith("GET /ws") for line, _ in space.requests)


async def test_token_not_sent_across_a_cross_origin_redirect(server: EnvServer) -> None:
    """A Space redirecting /health to another origin: the other host gets no token; the
    Space itself gets it on every request."""
    async with SpaceStandIn(server.port, script=()) as elsewhere, \
            SpaceStandIn(server.port, script=(307,), redirect_to=elsewhere.url) as space:
        with override_space_urls({"owner/redirecting": space.url}):
            client = GenericEnvClient("owner/redirecting", token=TOKEN)
        async with client:
            await client.reset()
    assert elsewhere.requests and {auth for _l, auth in elsewhere.requests} == {None}
    assert {auth for _l, auth in space.requests} == {f"Bearer {TOKEN}"}
