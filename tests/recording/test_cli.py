"""envlink replay and envlink rollouts on recordings of the reference server."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from envlink import GenericEnvClient, RolloutRecorder
from envlink._cli.main import main
from envlink._cli.rerun import same_value, without_fields
from envlink.server import EnvServer, ServerThread
from envlink.server._environments.deterministic import DeterministicEnvironment
from envlink.server._environments.environment import Transition

from .conftest import load

pytestmark = pytest.mark.timeout(60)


def _record(url: str, directory: Path) -> list[dict[str, Any]]:
    with RolloutRecorder(directory) as recorder, \
            GenericEnvClient(url, recorder=recorder).sync() as env:
        for seed in (7, 8):
            env.reset(seed=seed, max_steps=5)
            for move in (1, 2, 3, 4, 5):
                env.step({"move": move})
    return load(directory)


def test_replay_reproduces_then_names_the_step_that_differs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recorded = tmp_path / "recorded"
    with ServerThread(env="deterministic", ping_interval=None) as st:
        episodes = _record(st.url, recorded)
    assert [len(e["steps"]) for e in episodes] == [5, 5]
    with ServerThread(env="deterministic", ping_interval=None) as fresh:
        assert main(["replay", str(recorded), "--url", fresh.url, "-j", "2"]) == 0
        out = capsys.readouterr().out
        assert out.count(": reproduced (5 steps)") == 2

        changed = tmp_path / "changed"
        changed.mkdir()
        (file,) = recorded.glob("*.jsonl")
        lines = file.read_text(encoding="utf-8").splitlines()
        second = json.loads(lines[1])
        second["steps"][3]["observation"]["position"] += 1
        lines[1] = json.dumps(second)
        (changed / file.name).write_text("\n".join(lines) + "\n", encoding="utf-8")

        assert main(["replay", str(changed), "--url", fresh.url]) == 1
        out = capsys.readouterr().out
        assert f"episode {second['episode_id']} ({file.name}#2): differs at step 3" in out
        assert "observation.position" in out and "| observation.position" in out
        assert f"episode {episodes[0]['episode_id']} ({file.name}#1): reproduced" in out

        assert main(["replay", str(changed), "--url", fresh.url, "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert (report["reproduced"], report["differs"]) == (1, 1)
        (diff,) = [r for r in report["results"] if r["status"] == "differs"]
        assert (diff["episode_id"], diff["at"]) == (second["episode_id"], "step 3")
        assert diff["recorded"]["observation"]["position"] == (
            diff["replayed"]["observation"]["position"] + 1)


def test_replay_usage_and_connection_errors(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "missing"), "--url", "ws://127.0.0.1:9"]) == 2
    assert main(["replay", str(tmp_path), "--url", "ws://127.0.0.1:9"]) == 2  # no episode
    assert main(["rollouts", str(tmp_path)]) == 2  # the same rule for both commands
    assert capsys.readouterr().err.count(f"no recorded episode in {tmp_path}") == 2
    with ServerThread(env="deterministic", ping_interval=None) as st:
        _record(st.url, tmp_path)
        port = st.port
    assert main(["replay", str(tmp_path), "--url", f"ws://127.0.0.1:{port}",
                 "--timeout", "5"]) == 2
    assert "cannot reach" in capsys.readouterr().err
    capsys.readouterr()
    # The verifier's name is checked before anything connects: its own message, and
    # no attempt to reach the (unreachable) server.
    assert main(["replay", str(tmp_path), "--url", "ws://127.0.0.1:9",
                 "--verify", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert "--verify must be one of exact, observation or module:function, got 'nonsense'" \
        in err
    assert "cannot reach" not in err
    assert main(["replay", str(tmp_path), "--url", "ws://127.0.0.1:9",
                 "--verify", "envlink_no_such_module:same"]) == 2
    err = capsys.readouterr().err
    assert "envlink_no_such_module" in err and "cannot reach" not in err


def test_rollouts_summarises(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(env="deterministic", ping_interval=None) as st:
        episodes = _record(st.url, tmp_path)
    assert main(["rollouts", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 2 and summary["outcomes"] == {"done": 2}
    assert summary["steps"] == 10 and summary["recovered_steps"] == 0
    mean = sum(e["return"] for e in episodes) / 2
    assert summary["return"]["mean"] == pytest.approx(mean)
    assert summary["latency"]["p50"] > 0
    assert list(summary["servers"].values()) == [2]
    assert main(["rollouts", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "2 episodes in 1 file\n" in text and "done 2" in text and "p99" in text


def test_demo_records_its_episode_with_the_recovered_step(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "envlink", "demo", "--steps", "2",
                           "--record", str(tmp_path)], capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0, done.stderr
    (file,) = tmp_path.glob("*.jsonl")
    assert f"\nrecorded (envlink rollouts / envlink replay read it):\n  {file}\n" in done.stdout
    (record,) = load(tmp_path)
    assert record["outcome"] == "close"
    assert [s["index"] for s in record["steps"] if s["recovered"]] == [0]


@pytest.mark.parametrize("option", [["-j", "0"], ["--timeout", "0"], ["--timeout", "nan"]])
def test_replay_refuses_an_option_out_of_range_as_a_usage_error(
        tmp_path: Path, option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """-j below 1 or a timeout that is not positive: exit 2 with the reason, nothing run."""
    assert main(["replay", str(tmp_path), "--url", "http://127.0.0.1:9", *option]) == 2
    assert "must be" in capsys.readouterr().err


class _Failing(DeterministicEnvironment):
    """Fails at the step with ``move == 3`` once ``failing`` is set (the replay)."""

    failing = False

    def step(self, action: dict[str, Any]) -> Transition:
        if _Failing.failing and action.get("move") == 3:
            raise RuntimeError("the environment broke")
        return super().step(action)


class _Dropping(DeterministicEnvironment):
    """Once ``server`` is set, its first reset makes the server drop the connection
    at the next request and refuse every reconnection: lost after the reset."""

    server: EnvServer | None = None

    def reset(self, seed: int = 0, max_steps: int | None = None,
              episode_id: str | None = None) -> Transition:
        if _Dropping.server is not None:
            faults = _Dropping.server.faults
            faults.drop_after, faults.drop_mode = 1, "before_apply"
            faults.refuse_for(60.0)
        return super().reset(seed, max_steps, episode_id)


def test_replay_exits_2_when_the_server_fails_or_is_lost_mid_episode(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An error answer after the reset, or a connection lost after it: exit 2 naming
    the step, not 1 (an answer that differs)."""
    _Failing.failing = False
    with ServerThread(env=_Failing, ping_interval=None) as st:
        _record(st.url, tmp_path)
        _Failing.failing = True
        try:
            assert main(["replay", str(tmp_path), "--url", st.url]) == 2
        finally:
            _Failing.failing = False
    captured = capsys.readouterr()
    assert captured.out.count("could not be judged: the server failed at step 2") == 2
    assert "2 episodes: 0 reproduced, 0 differ, 2 could not be judged" in captured.out
    assert "could not be judged" in captured.err
    with ServerThread(env=_Dropping, ping_interval=None) as st:
        _Dropping.server = st.server
        try:
            assert main(["replay", str(tmp_path), "--url", st.url, "-j", "1",
                         "--timeout", "5"]) == 2
        finally:
            _Dropping.server = None
    captured = capsys.readouterr()
    assert "the server failed at step 0" in captured.out, captured.err
    assert "differs" not in captured.out


def test_replay_and_rollouts_name_malformed_and_foreign_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(env="deterministic", ping_interval=None) as st:
        episodes = _record(st.url, tmp_path / "rec")
        (file,) = (tmp_path / "rec").glob("*.jsonl")
        mixed = tmp_path / "mixed.jsonl"
        lines = file.read_text(encoding="utf-8").splitlines()
        mixed.write_text("\n".join([lines[0], "{not json", json.dumps({"a": 1}), "[1, 2]",
                                    json.dumps({"schema": "envlink.rollout/9"}), lines[1],
                                    lines[1][:40]]), encoding="utf-8")
        assert main(["replay", str(mixed), "--url", st.url]) == 0
        captured = capsys.readouterr()
        assert "2 episodes: 2 reproduced, 0 differ" in captured.out
        for number in (2, 3, 4, 5, 7):
            assert f"{mixed}:{number}: " in captured.err
        assert f"{mixed}:2: not JSON" in captured.err
        assert f"{mixed}:3: not an envlink.rollout record" in captured.err
        assert f"{mixed}:7: a partial last line" in captured.err
        assert "Traceback" not in captured.err

        assert main(["rollouts", str(mixed), "--json"]) == 0
        captured = capsys.readouterr()
        summary = json.loads(captured.out)
        assert (summary["episodes"], summary["skipped_lines"]) == (len(episodes), 5)
        assert f"{mixed}:3: not an envlink.rollout record" in captured.err

        foreign = tmp_path / "foreign"
        foreign.mkdir()
        (foreign / "other.jsonl").write_text('{"episode": 1, "steps": []}\n{"x": 2}\n',
                                             encoding="utf-8")
        assert main(["rollouts", str(foreign)]) == 2  # no JSON object counts as an episode
        assert "no recorded episode" in capsys.readouterr().err
        assert main(["replay", str(foreign), "--url", st.url]) == 2
        assert "no recorded episode" in capsys.readouterr().err


def test_a_verifier_that_raises_is_reported_as_that(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(env="deterministic", ping_interval=None) as st:
        _record(st.url, tmp_path)
        # json.loads takes one positional argument: as a verifier it raises TypeError.
        assert main(["replay", str(tmp_path), "--url", st.url, "--verify", "json:loads"]) == 2
    captured = capsys.readouterr()
    assert "the verifier json:loads raised at reset: TypeError" in captured.out
    assert "Traceback" not in captured.err and "differs" not in captured.out


class _Stamped(DeterministicEnvironment):
    """Metadata with a timestamp (differs on every run) and a NaN score."""

    def step(self, action: dict[str, Any]) -> Transition:
        out = super().step(action)
        return Transition(observation=out.observation, reward=out.reward, done=out.done,
                          metadata={"timestamp": time.time(), "score": math.nan})


def test_ignore_leaves_fields_out_and_nan_equals_nan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(env=_Stamped, ping_interval=None) as st:
        (first, _) = _record(st.url, tmp_path)
        assert math.isnan(first["steps"][0]["extra"]["metadata"]["score"])
        assert main(["replay", str(tmp_path), "--url", st.url]) == 1
        out = capsys.readouterr().out
        assert "differs at step 0" in out and "metadata.timestamp" in out
        assert "metadata.score" not in out  # NaN == NaN
        assert main(["replay", str(tmp_path), "--url", st.url,
                     "--ignore", "metadata.timestamp",
                     "--ignore", "observation.metadata.timestamp"]) == 0
        assert "2 episodes: 2 reproduced, 0 differ" in capsys.readouterr().out


def test_same_value_and_without_fields() -> None:
    nan = float("nan")
    assert same_value({"a": [nan, {"b": nan}]}, {"a": [nan, {"b": nan}]})
    assert not same_value({"a": [nan]}, {"a": [1.0]})
    assert not same_value({"a": 1}, {"a": 1, "b": 2})
    answer = {"observation": {"t": 1, "x": 2}, "metadata": {"timestamp": 3, "k": 4}}
    assert without_fields(answer, ["metadata.timestamp", "observation.t", "no.such"]) == {
        "observation": {"x": 2}, "metadata": {"k": 4}}
    assert answer["metadata"] == {"timestamp": 3, "k": 4}  # a copy


def test_a_redacted_recording_cannot_be_verified(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(env="deterministic", ping_interval=None) as st:
        with RolloutRecorder(tmp_path, redact=lambda value: "[redacted]") as recorder, \
                GenericEnvClient(st.url, recorder=recorder).sync() as env:
            env.reset(seed=1, max_steps=2)
            env.step({"move": 1})
            env.step({"move": 2})
        (record,) = load(tmp_path)
        assert record["redacted"] is True
        assert main(["replay", str(tmp_path), "--url", st.url]) == 0
        out = capsys.readouterr().out
        assert f"episode {record['episode_id']}" in out
        assert ": cannot verify (redacted)" in out and "differs" not in out
        assert "1 episode: 0 reproduced, 0 differ, 1 cannot verify (redacted)" in out


def test_records_of_the_wrong_shape_are_named_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"schema": "envlink.rollout/1", "episode_id": "e", "session_id": "s", "pid": 1,
            "start": 1.0, "reset": {"kwargs": {}, "observation": None}, "steps": [],
            "outcome": "done"}
    wrong = [dict(base, episode_id=["a"]), dict(base, steps=[{"index": 0}]),
             dict(base, reset={"kwargs": [1]}), dict(base, part=0), dict(base, reset=None),
             dict(base, outcome=None)]
    (tmp_path / "w.jsonl").write_text("".join(json.dumps(r) + "\n" for r in wrong),
                                      encoding="utf-8")
    for command in (["rollouts", str(tmp_path)],
                    ["replay", str(tmp_path), "--url", "ws://127.0.0.1:9"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        for number in range(1, len(wrong) + 1):
            assert f"w.jsonl:{number}: " in err
        assert "no recorded episode" in err and "Traceback" not in err
