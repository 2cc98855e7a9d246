"""The real third-party providers on PyPI, openenv-sprites and openenv-openshell (installed
in the openenv virtualenv by .ci/openenv-venv.sh), through OpenEnv's client and
envlink's, their cloud calls faked at their SDK boundary (see
clients/third_party_providers.py): each case ends the same way with both clients (each
call OK or the same exception class, the same cloud calls), and a failed delete is
never hidden.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from typing import Any

import pytest

from ._interop_support import CLIENTS, RecordingServer

pytestmark = pytest.mark.timeout(240)

SCENARIO = CLIENTS / "third_party_providers.py"

OK_EPISODE = [["reset", "ok"], ["step", "ok"]]


@pytest.fixture(scope="module")
def openenv_site(openenv_py: str) -> str:
    """The openenv virtualenv's site-packages (holding the provider packages)."""
    done = subprocess.run(
        [openenv_py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, timeout=60, check=True)
    site = done.stdout.strip()
    assert sysconfig.get_paths()["purelib"] != site, "the driver needs both interpreters"
    return site


def _run(which: str, case: str, openenv_py: str, site: str, url: str) -> dict[str, Any]:
    python = openenv_py if which == "openenv" else sys.executable
    done = subprocess.run([python, str(SCENARIO), which, case, url], capture_output=True,
                          text=True, timeout=150, check=False, stdin=subprocess.DEVNULL,
                          env={**os.environ, "OPENENV_SITE": site})
    assert done.returncode == 0, f"{which} / {case}: {done.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _both(case: str, openenv_py: str, site: str,
          server: RecordingServer) -> dict[str, Any]:
    """The case with each client; envlink's report must be OpenEnv's (the exceptions'
    messages aside)."""
    theirs = _run("openenv", case, openenv_py, site, server.base_url)
    ours = _run("envlink", case, openenv_py, site, server.base_url)
    errors = {"openenv": theirs.pop("errors"), "envlink": ours.pop("errors")}
    assert ours == theirs, errors
    return theirs


def _calls(report: dict[str, Any]) -> list[list[Any]]:
    return [call for call in report["calls"] if call[0] != "observations"]


def _observations(report: dict[str, Any]) -> list[int]:
    (_, reset, step), = (call for call in report["calls"] if call[0] == "observations")
    return [reset["total"], step["total"]]


@pytest.mark.parametrize("case", ["sprites_owned", "sprites_from_docker_image"])
def test_a_sprite_runs_an_episode_and_is_deleted(
        case: str, openenv_py: str, openenv_site: str, counter_server: RecordingServer) -> None:
    """SpritesProvider started by the client (source= on the provider) or by
    from_docker_image: an episode through the provider's own local WebSocket bridge, then
    close() deletes the Sprite once and closes the SDK client, with both clients."""
    report = _both(case, openenv_py, openenv_site, counter_server)
    closes = [["close", "ok"]] + ([["close again", "ok"]] if case == "sprites_owned" else [])
    start = [] if case == "sprites_owned" else [["from_docker_image", "ok"]]
    assert _calls(report) == [*start, *OK_EPISODE, *closes]
    assert _observations(report) == [0, 3]
    assert report["cloud"] | {"connects": 0} == {
        "created": 1, "delete_calls": 1, "deleted": 1, "sdk_clients": 1,
        "sdk_clients_closed": 1, "connects": 0}
    assert report["diagnostics"] == {"sprite_delete_attempted": True, "sprite_deleted": True}


def test_a_failed_sprite_delete_reaches_the_caller(
        openenv_py: str, openenv_site: str, counter_server: RecordingServer) -> None:
    """SpritesProvider.stop_container() clears its handles before it deletes: when the
    delete fails, close() raises SpritesProviderError with both clients (never a close
    that returns as if the Sprite were gone); the second close() finds nothing to do."""
    report = _both("sprites_failed_delete", openenv_py, openenv_site, counter_server)
    assert _calls(report) == [*OK_EPISODE, ["close", "SpritesProviderError"],
                              ["close again", "ok"]]
    assert report["cloud"]["delete_calls"] == 1 and report["cloud"]["deleted"] == 0
    assert report["diagnostics"] == {"sprite_delete_attempted": True, "sprite_deleted": False}


def test_openshell_provider_without_an_image_is_refused(
        openenv_py: str, openenv_site: str, counter_server: RecordingServer) -> None:
    """OpenShellProvider as EnvClient(provider=p): its start_container() needs an image,
    so connecting raises ValueError with both clients, before any cloud call."""
    report = _both("openshell_missing_image", openenv_py, openenv_site, counter_server)
    assert _calls(report) == [["connect", "ValueError"], ["reset", "ValueError"],
                              ["close", "ok"]]
    assert set(report["cloud"].values()) == {0}


@pytest.mark.parametrize("case", ["openshell_from_docker_image", "openshell_failed_delete",
                                  "openshell_delete_retried"])
def test_an_openshell_sandbox_through_from_docker_image(
        case: str, openenv_py: str, openenv_site: str, counter_server: RecordingServer) -> None:
    """OpenShellProvider through from_docker_image: an episode, then close() deletes the
    sandbox; a failed delete raises SandboxDeletionError from close() with both clients,
    and the next close() tries the pending stop again (failing again, or confirming)."""
    report = _both(case, openenv_py, openenv_site, counter_server)
    closes = {
        "openshell_from_docker_image": [["close", "ok"], ["close again", "ok"]],
        "openshell_failed_delete": [["close", "SandboxDeletionError"],
                                    ["close again", "SandboxDeletionError"]],
        "openshell_delete_retried": [["close", "SandboxDeletionError"],
                                     ["close again", "ok"]],
    }[case]
    assert _calls(report) == [["from_docker_image", "ok"], *OK_EPISODE, *closes]
    assert _observations(report) == [0, 3]
    assert report["cloud"]["created"] == report["cloud"]["delete_calls"] == 1
    assert report["state"]["deleted"] is (case != "openshell_failed_delete")
