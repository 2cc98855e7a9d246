"""envlink replay and envlink rollouts on recordings of the reference server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envlink import GenericEnvClient, RolloutRecorder
from envlink._cli.main import main
from envlink.server import ServerThread

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
    with ServerThread(env="deterministic", ping_interval=None) as st:
        _record(st.url, tmp_path)
        port = st.port
    assert main(["replay", str(tmp_path), "--url", f"ws://127.0.0.1:{port}",
                 "--timeout", "5"]) == 2
    assert "cannot reach" in capsys.readouterr().err
    assert main(["replay", str(tmp_path), "--url", "ws://127.0.0.1:9",
                 "--verify", "nonsense"]) == 2


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
    assert "2 episodes in 1 files" in text and "done 2" in text and "p99" in text


def test_demo_records_its_episode_with_the_recovered_step(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "envlink", "demo", "--steps", "2",
                           "--record", str(tmp_path)], capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0, done.stderr
    (record,) = load(tmp_path)
    assert record["outcome"] == "close"
    assert [s["index"] for s in record["steps"] if s["recovered"]] == [0]


@pytest.mark.parametrize("option", [["-j", "0"], ["--timeout", "0"], ["--timeout", "nan"]])
def test_replay_refuses_an_option_out_of_range_as_a_usage_error(
        tmp_path: Path, option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """-j below 1 or a timeout that is not positive: exit 2 with the reason, nothing run."""
    assert main(["replay", str(tmp_path), "--url", "http://127.0.0.1:9", *option]) == 2
    assert "must be" in capsys.readouterr().err
