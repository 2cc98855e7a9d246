"""provider= with a subclass of OpenEnv's own RuntimeProvider: OpenEnv's client and
envlink's run the same code (only the import differs) and both work, leaving no server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from .._processes import process_gone
from ._interop_support import CLIENTS, REPO_ROOT, SERVERS

pytestmark = pytest.mark.timeout(400)

SCENARIO = CLIENTS / "provider_parity.py"


def _providers_module(openenv_py: str) -> str:
    done = subprocess.run(
        [openenv_py, "-c", "import openenv.core.containers.runtime.providers as m; "
                           "print(m.__file__)"],
        capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def _run(which: str, openenv_py: str) -> dict[str, Any]:
    python = openenv_py if which == "openenv" else sys.executable
    env = {**os.environ, "OPENENV_PROVIDERS_PY": _providers_module(openenv_py),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT / "src"),
                                                       os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [python, str(SCENARIO), which, openenv_py, str(SERVERS / "counter_server.py")],
        capture_output=True, text=True, timeout=180, check=False, env=env,
        stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{which}: {done.stderr[-3000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_runtime_provider_subclass_works_with_both_clients(openenv_py: str) -> None:
    """The same provider= program gives the same answers on both clients; the child shares
    the provider's server, and after close() the server process is gone."""
    results = {which: _run(which, openenv_py) for which in ("openenv", "envlink")}
    for which, result in results.items():
        assert process_gone(int(result.pop("pid"))), f"{which} left the server running"
        assert result["stopped"] is True
        assert result["child_same_server"] is True
    assert results["envlink"] == results["openenv"]
    assert results["envlink"]["step_observation"]["total"] == 3
    assert results["envlink"]["child_observation"]["total"] == 5
