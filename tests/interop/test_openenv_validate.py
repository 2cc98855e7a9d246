"""The real ``openenv validate --url`` against ``envlink serve``: every check passes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ._interop_support import ServerProcess, python_command

pytestmark = pytest.mark.timeout(600)

#: The criteria ``openenv validate --url`` reports in 0.10 (all required).
EXPECTED_CRITERIA = {"openapi_version_available", "health_endpoint", "metadata_endpoint",
                     "schema_endpoint", "mcp_endpoint", "mode_endpoint_consistency"}


@pytest.mark.parametrize(("env", "extra"), [
    ("echo", ()), ("deterministic", ("--detached-sessions", "--no-extensions"))],
    ids=["echo", "deterministic-detached-plain"])
def test_openenv_validate_passes_every_check(openenv_py: str, tmp_path: Path, env: str,
                                             extra: tuple[str, ...]) -> None:
    """`openenv validate --url --json` passes all of its runtime checks against envlink serve."""
    validate = Path(openenv_py).with_name("openenv")
    assert validate.exists(), f"no openenv command beside {openenv_py}"
    server = ServerProcess(
        python_command("-m", "envlink", "serve", "--port", "0", "--env", env, *extra),
        name=f"envlink-validate-{env}", log_dir=tmp_path)
    server.start()
    try:
        completed = subprocess.run(
            [str(validate), "validate", "--url", server.base_url, "--json"],
            capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    finally:
        server.stop()
    report = json.loads(completed.stdout)
    failed = [c for c in report["criteria"] if not c["passed"]]
    assert not failed, json.dumps(failed, indent=2)
    assert {c["id"] for c in report["criteria"]} == EXPECTED_CRITERIA
    assert report["passed"] is True and completed.returncode == 0
    assert report["standard_profile"] == "openenv-http/1.x"
    assert report["mode"] == "simulation"
