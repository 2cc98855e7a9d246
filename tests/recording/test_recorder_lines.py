"""The writer's line, cut from the frames: the same record as parsing them and
serialising it again, for every frame layout a server sends; and the cut taken where
it can be (the writer's work per step), not left to the slow path."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic_core import to_json

from envlink import GenericEnvClient, RolloutRecorder
from envlink._recording import writer
from envlink._recording.writer import Episode, episode_line, episode_record
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(60)

ACTION = {"type": "call_tool", "tool_name": "echo", "arguments": {"message": "hi \"x\"\n"}}
DATA = {"observation": {"text": "a\nb", "id": 3, "nested": {"data": [1, 2]}},
        "reward": 0.5, "done": False}


def _request(n: int, action: dict[str, Any] = ACTION) -> bytes:
    return b'{"id":"c-%d","type":"step","data":%b}' % (n, to_json(action))


def _ours(n: int, data: dict[str, Any] = DATA) -> bytes:
    """envlink's server: the request id after the data."""
    return b'{"type":"observation","data":%b,"id":"c-%d"}' % (to_json(data), n)


def _openenv(n: int, data: dict[str, Any] = DATA) -> bytes:
    """OpenEnv 0.10's server: no id."""
    return b'{"type":"observation","data":%b}' % to_json(data)


def _episode(replies: list[Any], *, recovered: str | None = None,
             trace: tuple[int, int] | None = None, requests: list[Any] | None = None,
             ) -> Episode:
    reset = (True, b'{"id":"c-0","type":"reset","data":{"seed":1}}',
             b'{"type":"observation","data":{"observation":{"s":0},"reward":null,'
             b'"done":false},"id":"c-0"}')
    ep = Episode("ws://127.0.0.1:1/ws", "s-1", "e-1", reset)
    for n, reply in enumerate(replies, 1):
        sent = requests[n - 1] if requests is not None else _request(n)
        ep.steps.append((True, sent, reply, ep.start_perf + n, 0.001 * n, n % 2,
                         recovered, trace))
    ep.outcome, ep.end = "done", ep.start_wall + 10
    return ep


def _same(ep: Episode) -> dict[str, Any]:
    """The line, checked against the record made by parsing every frame."""
    line = episode_line(ep, None)
    assert b"\n" not in line and b"\r" not in line
    got = json.loads(line)
    want = json.loads(to_json(episode_record(ep, None), inf_nan_mode="constants"))
    assert got == want
    return got


@pytest.mark.parametrize("frame", [_ours, _openenv], ids=["envlink", "openenv"])
def test_the_cut_line_is_the_parsed_record_and_is_taken(frame: Any) -> None:
    ep = _episode([frame(n) for n in range(1, 5)])
    assert writer._steps_text(ep) is not None  # the cut, not the slow path
    got = _same(ep)
    assert [s["action"] for s in got["steps"]] == [ACTION] * 4
    assert got["steps"][0]["observation"] == DATA["observation"]
    assert got["return"] == 2.0
    assert [s["index"] for s in got["steps"]] == [0, 1, 2, 3]


def test_text_frames_recovery_and_trace_ids_are_cut_as_well() -> None:
    # The websockets transport gives text frames as str.
    ep = _episode([_ours(n).decode() for n in (1, 2)], recovered="replay",
                  trace=(0xABC, 0xDEF))
    assert writer._steps_text(ep) is not None
    got = _same(ep)
    assert got["steps"][1]["recovery"] == "replay"
    assert got["steps"][1]["trace_id"] == f"{0xABC:032x}"


@pytest.mark.parametrize("reply", [
    # An "id" member inside the data and no id after it.
    b'{"type":"observation","data":{"observation":{"x":1},"reward":null,"done":true,'
    b'"extra":{"a":1,"id":2}}}',
    b'{"type":"observation","data":{"observation":{"a":1,"id":2},"reward":1,"done":true}}',
    # Pretty-printed: line breaks between tokens.
    b'{"type":"observation","data":{\n  "observation": {"k": "v\\nw"},\r\n  "reward": -2,'
    b'\n  "done": false\n},"id":"c-1"}',
    # Members the record keeps apart ("extra"), another order, a member after the data.
    b'{"type":"observation","data":{"observation":1,"reward":null,"done":false,'
    b'"metadata":{"m":1}},"id":"c-1"}',
    b'{"type":"observation","data":{"done":false,"reward":null,"observation":[1]},'
    b'"seq":4,"id":"c-1"}',
    b'{"type":"observation","data":{"observation":1,"reward":true,"done":false}}',
    b'{"type":"observation","data":{"observation":1,"done":0,"reward":null}}',
    b'{"type":"observation","data":{"observation":1,"reward":NaN,"done":false}}',
    b'{"data":{"observation":1,"reward":null,"done":false},"type":"observation"}',
    # A data key hidden in a member before the data.
    b'{"type":"observation","x":{"k\\"data":{"observation":1,"reward":null,"done":false}}'
    b',"data":{"observation":2,"reward":null,"done":false},"id":"c-1"}',
], ids=["id-in-data", "id-in-observation", "pretty", "extra", "order-seq", "bool-reward",
        "int-done", "nan", "data-first", "hidden-key"])
def test_any_layout_gives_the_parsed_record(reply: bytes) -> None:
    ep = _episode([reply, _ours(2)])
    got = _same(ep)
    assert len(got["steps"]) == 2
    if b'"reward":NaN' in reply:
        assert math.isnan(got["steps"][0]["reward"])


def test_a_request_not_laid_out_as_envlink_writes_it_takes_the_slow_path() -> None:
    mcp = b'{"id":"c-1","type":"mcp","data":{"method":"tools/list"}}'
    ep = _episode([_ours(1)], requests=[mcp])
    assert writer._steps_text(ep) is None
    _same(ep)


def test_parts_carry_the_return_across_the_cut_and_the_slow_path() -> None:
    first = _episode([_ours(1), _ours(2)])
    second = first.next_part()
    second.steps.append((True, _request(3), _openenv(3), first.start_perf + 3, 0.1, 0,
                         None, None))
    third = second.next_part()
    third.steps.append((False, to_json(ACTION), to_json(DATA), first.start_perf + 4, 0.1,
                        0, None, None))  # answered through recovery: payload texts
    assert [json.loads(episode_line(p, None))["return"] for p in (first, second, third)] \
        == [1.0, 1.5, 2.0]
    assert json.loads(episode_line(second, None))["steps"][0]["index"] == 2


async def test_a_recorded_episode_is_cut_on_both_transports(tmp_path: Any,
                                                            monkeypatch: Any) -> None:
    """A real server and client: every line the writer wrote was cut, and equals the
    record made by parsing."""
    cut: list[bool] = []
    real = writer._steps_text

    def watched(ep: Episode) -> Any:
        made = real(ep)
        cut.append(made is not None)
        if made is not None:
            assert json.loads(made[0]) == json.loads(to_json(episode_record(ep, None)))[
                "steps"]
        return made

    monkeypatch.setattr(writer, "_steps_text", watched)
    recorder = RolloutRecorder(tmp_path)
    async with EnvServer(env="echo", ping_interval=None) as srv:
        for transport in ("websockets", "picows"):
            try:
                client = GenericEnvClient(srv.url, recorder=recorder, transport=transport)
            except Exception as exc:  # picows missing: the dependency floors' run
                if transport == "picows":
                    pytest.skip(f"picows: {exc}")
                raise
            async with client as env:
                await env.reset()
                for _ in range(3):
                    await env.step({"type": "call_tool", "tool_name": "echo_message",
                                    "arguments": {"message": "hello"}})
    assert recorder.flush(10)
    recorder.close()
    assert cut and all(cut)
    lines = [json.loads(line) for path in recorder.files
             for line in path.read_text().splitlines()]
    assert sum(len(r["steps"]) for r in lines) == 6
