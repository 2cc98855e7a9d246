"""A Hugging Face Space by name, asleep then awake, in front of a real OpenEnv server.

The Space's host is a loopback stand-in (``tests/_space_standin.py``): 503, then the
HTML waking page, then every connection passed through to the stock OpenEnv counter
server. OpenEnv's own client has no Space-by-name path that could be pointed at
127.0.0.1 without DNS (``AutoEnv.from_env`` resolves ``*.hf.space``), so this side
runs envlink's client only; the episode's answers are checked against the server's.
"""

from __future__ import annotations

import pytest

from envlink import GenericEnvClient, ReconnectPolicy, set_testing
from envlink._launch.lifecycle import override_space_urls

from .._space_standin import SpaceStandIn
from ._interop_support import RecordingServer

pytestmark = pytest.mark.timeout(60)

TOKEN = "hf_interopTOKEN"


async def test_sleeping_space_by_name_then_an_episode(counter_server: RecordingServer) -> None:
    """`GenericEnvClient("owner/space")` waits for the Space to wake, sends the token on
    every request, and runs an episode on the real OpenEnv server behind it."""
    async with SpaceStandIn(counter_server.port, script=(503, 200, 503)) as space:
        with override_space_urls({"owner/counter": space.url}), set_testing():
            client = GenericEnvClient("owner/counter", token=TOKEN,
                                      reconnect=ReconnectPolicy(max_elapsed=20.0))
            async with client:
                await client.reset()
                first = await client.step({"delta": 2})
                second = await client.step({"delta": 3})
                state = await client.state()
    assert (first.observation["total"], second.observation["total"]) == (2, 5)
    assert state["step_count"] == 2
    assert space.scripted_left == 0
    assert {auth for _line, auth in space.requests} == {f"Bearer {TOKEN}"}
