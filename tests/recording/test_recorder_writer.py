"""The writer cannot die, memory is bounded in bytes (the drop path), writes and close()
are coordinated, a short write never glues two lines, and a recorder that is
garbage-collected closes its file."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envlink import GenericEnvClient, RolloutRecorder
from envlink._recording import writer
from envlink.server import EnvServer

from .._otel_support import Otel
from .conftest import load

pytestmark = pytest.mark.timeout(60)


async def _episodes(url: str, recorder: RolloutRecorder, lengths: list[int]) -> None:
    async with GenericEnvClient(url, recorder=recorder) as env:
        for seed, length in enumerate(lengths):
            await env.reset(seed=seed, max_steps=length)
            for _ in range(length):
                await env.step({"move": 1})


@pytest.fixture
def recording_counters(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The recorder's counters made on a meter provider of the test's own."""
    with Otel.capture() as otel:
        meter = otel.meter_provider.get_meter("envlink")
        counters = writer._Counters()
        counters._made = (meter.create_counter(writer.METRIC_RECORDING_EPISODES),
                          meter.create_counter(writer.METRIC_RECORDING_STEPS))
        monkeypatch.setattr(writer, "_COUNTERS", counters)
        yield otel


def _counted(otel: Otel, metric: str) -> dict[str, int]:
    return {p.attributes[writer.ATTR_RECORDING_RESULT]: p.value for p in otel.points(metric)}


async def test_past_max_buffered_bytes_an_open_episode_is_dropped_whole(
        tmp_path: Path, recording_counters: Otel, caplog: pytest.LogCaptureFixture) -> None:
    # A first reservation fits; an episode whose frames outgrow it does not.
    recorder = RolloutRecorder(tmp_path, max_buffered_bytes=10_000)
    with caplog.at_level(logging.WARNING, logger="envlink.recording"):
        async with EnvServer(env="deterministic", ping_interval=None) as srv:
            await _episodes(srv.url, recorder, [2, 200, 3])
    recorder.close()
    records = load(tmp_path)
    assert [len(r["steps"]) for r in records] == [2, 3]  # the long one: none of it
    stats = recorder.stats
    assert (stats["episodes_written"], stats["steps_written"]) == (2, 5)
    assert stats["episodes_dropped"] == 1 and 10 < stats["steps_dropped"] < 200
    assert _counted(recording_counters, writer.METRIC_RECORDING_EPISODES) == {
        "written": 2, "dropped": 1}
    assert _counted(recording_counters, writer.METRIC_RECORDING_STEPS) == {
        "written": 5, "dropped": stats["steps_dropped"]}
    assert "max_buffered_bytes" in caplog.text
    assert recorder.sink.held_bytes == 0  # everything held was given back


async def test_past_max_buffered_steps_a_finished_episode_is_dropped_whole(
        tmp_path: Path, recording_counters: Otel) -> None:
    recorder = RolloutRecorder(tmp_path, max_buffered_steps=3)
    async with EnvServer(env="deterministic", ping_interval=None) as srv:
        await _episodes(srv.url, recorder, [4, 2])
    recorder.close()
    assert [len(r["steps"]) for r in load(tmp_path)] == [2]
    assert recorder.stats == {"episodes_written": 1, "steps_written": 2,
                              "episodes_dropped": 1, "steps_dropped": 4}
    assert _counted(recording_counters, writer.METRIC_RECORDING_STEPS) == {
        "written": 2, "dropped": 4}


async def test_the_writer_survives_what_goes_wrong_with_an_episode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resets = []

    def redact(value: Any) -> Any:
        if isinstance(value, dict) and value.get("step") == 0:
            resets.append(value)
            if len(resets) == 2:  # the second episode's reset
                raise SystemExit("a redactor that exits")  # what ends a thread
        return value

    failing = [True]
    real_write = writer.Sink.write

    def write_once_failing(self: writer.Sink, items: list[Any]) -> None:
        if failing:
            failing.pop()
            raise TypeError("not what a write raises")
        real_write(self, items)

    monkeypatch.setattr(writer.Sink, "write", write_once_failing)
    recorder = RolloutRecorder(tmp_path, redact=redact)
    async with EnvServer(env="deterministic", ping_interval=None) as srv:
        await _episodes(srv.url, recorder, [2])  # its write raises
        assert recorder.flush()
        await _episodes(srv.url, recorder, [1])  # its redaction exits
        assert recorder.flush()
        await _episodes(srv.url, recorder, [3])
    assert recorder.close()
    assert [len(r["steps"]) for r in load(tmp_path)] == [3]
    assert recorder.stats == {"episodes_written": 1, "steps_written": 3,
                              "episodes_dropped": 2, "steps_dropped": 3}
    assert writer._process_writer().thread.is_alive()


async def test_nothing_is_opened_or_written_after_close(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path)
    async with EnvServer(env="deterministic", ping_interval=None) as srv:
        await _episodes(srv.url, recorder, [1])
        assert recorder.close()
        await _episodes(srv.url, recorder, [2])
    assert recorder.sink.fd is None
    assert len(recorder.files) == 1
    assert os.listdir(tmp_path) == [recorder.files[0].name]
    assert recorder.stats == {"episodes_written": 1, "steps_written": 1,
                              "episodes_dropped": 1, "steps_dropped": 2}


def _open_files() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self/fd")
async def test_a_recorder_garbage_collected_closes_its_file(tmp_path: Path) -> None:
    recorder = RolloutRecorder(tmp_path)
    async with EnvServer(env="deterministic", ping_interval=None) as srv:
        await _episodes(srv.url, recorder, [1])
    assert recorder.flush()
    (path,) = recorder.files
    assert str(path) in _open_files()
    del recorder
    gc.collect()
    assert str(path) not in _open_files()


SHORT_WRITE = """
import json, resource, sys
from envlink import GenericEnvClient, RolloutRecorder
from envlink.server import ServerThread

recorder = RolloutRecorder(sys.argv[1])
# A file size limit: the write that crosses it is short, the next one fails (EFBIG).
resource.setrlimit(resource.RLIMIT_FSIZE, (1500, resource.RLIM_INFINITY))
with ServerThread(env="deterministic", ping_interval=None) as st:
    with GenericEnvClient(st.url, recorder=recorder).sync() as env:
        for seed in range(6):
            if seed == 4:  # room again
                resource.setrlimit(resource.RLIMIT_FSIZE,
                                   (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            env.reset(seed=seed, max_steps=1)
            env.step({"move": 1})
            assert recorder.flush()
recorder.close()
print(json.dumps(recorder.stats))
"""


def test_a_short_write_never_glues_the_next_line_onto_a_partial_one(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SHORT_WRITE, str(tmp_path)],
                         capture_output=True, text=True, timeout=50, check=True)
    stats = json.loads(out.stdout)
    (path,) = tmp_path.glob("*.jsonl")
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # the file ends with a whole line
    whole, partial = [], []
    for line in lines[:-1]:
        try:
            whole.append(json.loads(line))
        except ValueError:
            partial.append(line)
    assert len(partial) == 1 and partial[0].startswith(b'{"schema"')
    assert path.stat().st_size > 1500
    assert [r["reset"]["kwargs"]["seed"] for r in whole][-2:] == [4, 5]
    assert stats["episodes_written"] == len(whole)
    assert stats["episodes_written"] + stats["episodes_dropped"] == 6
