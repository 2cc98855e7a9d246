"""envlink rollouts --export: any recording loads as one dataset, whatever the shapes.

Two processes record into one directory against the reference server's echo (MCP)
environment: one a ``call_tool`` answer, the other a ``list_tools`` answer, so the
observations differ in shape from file to file (the case a schema inferred from the
JSON lines cannot unify).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envlink import GenericEnvClient, RolloutRecorder
from envlink._cli.main import main
from envlink.server import ServerThread

from .conftest import load
from .test_parts import lines, split

pytestmark = pytest.mark.timeout(120)

CHILD = """
import sys
from envlink import CallToolAction, EchoEnv, ListToolsAction, RolloutRecorder

url, directory, which = sys.argv[1:4]
with RolloutRecorder(directory) as recorder, \\
        EchoEnv(base_url=url, recorder=recorder).sync() as env:
    env.reset()
    if which == "call":
        env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
    else:
        env.step(ListToolsAction())
"""


@pytest.fixture(scope="module")
def two_shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory written by two processes: a call_tool answer and a list_tools one."""
    directory = tmp_path_factory.mktemp("two-shapes")
    with ServerThread(env="echo", ping_interval=None) as st:
        for which in ("call", "list"):
            subprocess.run([sys.executable, "-c", CHILD, st.url, str(directory), which],
                           check=True, timeout=60, capture_output=True)
    return directory


def _datasets(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    return datasets


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_directory_of_two_processes_loads_as_one_dataset(
        two_shapes: Path, tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Both come with the dev extra (envlink[dataset] and datasets), so the suite runs
    # this everywhere but on the bare dependency floors (.ci/floors.sh).
    if suffix == ".parquet":
        pytest.importorskip("pyarrow", reason="Parquet export needs envlink[dataset]")
    pytest.importorskip("datasets", reason="the loading check needs Hugging Face datasets")
    records = load(two_shapes)
    assert len({r["pid"] for r in records}) == 2
    shapes = {frozenset(r["steps"][0]["observation"]) for r in records}
    assert len(shapes) == 2  # {"tool_name", "result", ...} and {"tools", ...}

    out = tmp_path / f"episodes{suffix}"
    assert main(["rollouts", str(two_shapes), "--export", str(out)]) == 0
    assert f"wrote 2 episode rows to {out} (from 2 episodes in 2 files)" in (
        capsys.readouterr().out)
    kind = "parquet" if suffix == ".parquet" else "json"
    datasets = _datasets(monkeypatch)
    table = datasets.load_dataset(kind, data_files=str(out), split="train",
                                  cache_dir=str(tmp_path / "cache"))
    assert table.num_rows == 2
    by_id = {row["episode_id"]: row for row in table}
    for record in records:
        row = by_id[record["episode_id"]]
        assert json.loads(row["observations"]) == [s["observation"] for s in record["steps"]]
        assert json.loads(row["actions"]) == [s["action"] for s in record["steps"]]
        assert json.loads(row["reset_kwargs"]) == record["reset"]["kwargs"]
        assert json.loads(row["reset_observation"]) == record["reset"]["observation"]
        assert (row["pid"], row["outcome"], row["steps"]) == (record["pid"], "close", 1)
    tools = [json.loads(r["observations"])[0] for r in table]
    assert sorted("tools" in o for o in tools) == [False, True]

    steps = tmp_path / f"steps{suffix}"
    assert main(["rollouts", str(two_shapes), "--export", str(steps), "--per", "step"]) == 0
    table = datasets.load_dataset(kind, data_files=str(steps), split="train",
                                  cache_dir=str(tmp_path / "cache"))
    assert table.num_rows == 2
    assert sorted(json.loads(r["action"])["type"] for r in table) == ["call_tool",
                                                                     "list_tools"]


def test_export_joins_parts_and_refuses_an_unknown_format(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet export needs envlink[dataset]")

    with ServerThread(env="deterministic", ping_interval=None) as st, \
            RolloutRecorder(tmp_path / "rec") as recorder, \
            GenericEnvClient(st.url, recorder=recorder).sync() as env:
        env.reset(seed=3, max_steps=4)
        for move in (1, 2, 3, 4):
            env.step({"move": move})
    (record,) = load(tmp_path / "rec")
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "a.jsonl").write_text(lines(split(record, [1, 3])), encoding="utf-8")
    out = tmp_path / "out.parquet"
    assert main(["rollouts", str(parts), "--export", str(out)]) == 0
    (row,) = pq.read_table(out).to_pylist()
    assert (row["steps"], row["parts"], row["return"]) == (4, 3, record["return"])
    assert row["rewards"] == [s["reward"] for s in record["steps"]]
    assert json.loads(row["actions"]) == [{"move": m} for m in (1, 2, 3, 4)]
    capsys.readouterr()
    assert main(["rollouts", str(parts), "--export", str(tmp_path / "out.csv")]) == 2
    assert "--export writes .parquet, .jsonl, .json files" in capsys.readouterr().err
    assert not (tmp_path / "out.csv").exists()
