"""The README's Quickstart and examples are true: run them against the reference server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def quickstart_commands() -> list[str]:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def test_quickstart_has_exactly_two_commands_and_ci_runs_the_test_one() -> None:
    """Two commands (demo, tests); .ci/run runs the README's test command verbatim."""
    commands = quickstart_commands()
    assert len(commands) == 2
    demo, tests = commands
    assert "envlink demo" in demo and "\n" not in demo
    assert "pytest" in tests and "\n" not in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_quickstart_says_the_test_run_skips_the_interop_suite_and_how_to_run_it() -> None:
    """The README's test run skips tests/interop: the Quickstart says so, why, and names
    the script that runs it (which exists)."""
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    after = section.split(quickstart_commands()[1], 1)[1]
    assert "skips the interop suite" in after and "own virtualenv" in after
    assert "bash .ci/interop.sh" in after
    assert (ROOT / ".ci" / "interop.sh").is_file()


def test_quickstart_gives_the_time_of_the_suite_and_of_the_interop_run() -> None:
    """How long the test run and the interop run take, on the machine size CI has."""
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    text = " ".join(section.split())
    assert "about 10 minutes on a 2-core machine" in text
    assert "about 17 minutes on a 2-core machine" in text


def test_usage_runs_the_cli_from_the_quickstarts_virtualenv() -> None:
    """The Quickstart installs into .venv without activating it: the first command of
    Usage activates it before running envlink."""
    usage = README.split("## Usage", 1)[1].split("\n## ", 1)[0]
    first = re.findall(r"```sh\n(.*?)\n```", usage, re.S)[0].splitlines()
    assert first[0] == ". .venv/bin/activate", first
    assert first[1].startswith("envlink serve")


def python_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)\n```", README, re.S)


@pytest.mark.parametrize("index", range(len(python_examples())))
def test_readme_python_examples_run(index: int) -> None:
    """Each Python example in the README runs as written (own process) against an echo server."""
    code = python_examples()[index]
    with ServerThread(env="echo") as st:
        code = code.replace("http://127.0.0.1:8000", st.http_url)
        code = code.replace("ws://127.0.0.1:8000", st.url)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=45, check=False)
    assert proc.returncode == 0, proc.stderr
    if "Echo environment ready!" in code:
        assert "Echo environment ready!" in proc.stdout
        assert "Hello, World!" in proc.stdout
