"""Every example of docs/migrating-from-openenv.md marked ``interop:`` really runs.

A block marked ``<!-- interop: CLIENT ENV -->`` runs with envlink's interpreter
(``envlink``) or the openenv virtualenv's (``openenv``). Echo examples run
against a real OpenEnv echo server and against envlink's reference server, so
the "before" and the "after" of each migration are shown to work on both;
examples for the seeded environment run against envlink's reference server.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._interop_support import REPO_ROOT, RecordingServer, ServerProcess, python_command

pytestmark = pytest.mark.timeout(60)

GUIDE = REPO_ROOT / "docs" / "migrating-from-openenv.md"
_BLOCK = re.compile(r"<!-- interop: (envlink|openenv) (echo|deterministic) -->\s*"
                    r"```python\n(.*?)```", re.DOTALL)
#: The URLs the guide's examples use for each environment.
_GUIDE_URLS = {"echo": "http://127.0.0.1:8000", "deterministic": "http://127.0.0.1:8001"}


def _examples() -> list[tuple[int, str, str, str]]:
    text = GUIDE.read_text(encoding="utf-8")
    found = []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append((line, match.group(1), match.group(2), match.group(3)))
    return found


EXAMPLES = _examples()
CASES = [
    pytest.param(client, env, code, server, id=f"line{line}-{client}-{env}-on-{server}")
    for line, client, env, code in EXAMPLES
    for server in (("openenv", "envlink") if env == "echo" else ("envlink",))
]


@pytest.fixture(scope="module")
def envlink_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """envlink's reference server for each environment the guide uses."""
    logs = tmp_path_factory.mktemp("guide-servers")
    processes = [ServerProcess(python_command("-m", "envlink.server", "--port", "0",
                                              "--env", env), name=f"guide-{env}", log_dir=logs)
                 for env in ("echo", "deterministic")]
    try:
        for process in processes:
            process.start()
        yield {"echo": processes[0].base_url, "deterministic": processes[1].base_url}
    finally:
        for process in processes:
            process.stop()


def test_the_guide_has_runnable_examples_for_both_clients() -> None:
    """The guide shows both the OpenEnv code and the envlink code it becomes."""
    kinds = {(client, env) for _, client, env, _ in EXAMPLES}
    assert {("openenv", "echo"), ("envlink", "echo"), ("envlink", "deterministic")} <= kinds
    for _, _, env, code in EXAMPLES:
        assert _GUIDE_URLS[env] in code, "an example does not use its server's documented URL"


@pytest.mark.parametrize(("client", "env", "code", "server"), CASES)
def test_guide_example_runs(client: str, env: str, code: str, server: str, openenv_py: str,
                            echo_server: RecordingServer, envlink_servers: dict[str, str],
                            tmp_path: Path) -> None:
    """The example runs to completion against the server it is written for."""
    url = echo_server.base_url if server == "openenv" else envlink_servers[env]
    python = openenv_py if client == "openenv" else sys.executable
    completed = subprocess.run(
        [python, "-c", code.replace(_GUIDE_URLS[env], url)], capture_output=True, text=True,
        timeout=45, check=False, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 0, f"{completed.stdout}\n{completed.stderr[-4000:]}"
    assert completed.stdout.strip(), "the example printed nothing"
