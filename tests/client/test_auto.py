"""AutoEnv, AutoAction and GenericAction: environment packages found by name, as in OpenEnv.

Each test installs a tiny environment package (``openenv-tally_env``, its client
an OpenEnv client of the stand-in OpenEnv, and ``openenv-plain_env``, whose client
is envlink's own) with pip, from a wheel built here, into a temporary directory:
no network, servers on 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import envlink
from envlink import AutoAction, AutoEnv, GenericAction
from envlink._launch.lifecycle import override_space_urls
from envlink.server import ServerThread

from .._ports import restartable_port
from ._openenv_standin import STANDIN, STANDIN_PACKAGES, write_standin

pytestmark = pytest.mark.timeout(60)

PLAIN_CLIENT = '''
import envlink

class PlainEnv(envlink.GenericEnvClient):
    """An environment package whose client is envlink's already."""

class PlainAction(dict):
    pass
'''


def _wheel(directory: Path, dist: str, files: dict[str, str]) -> Path:
    """A wheel of ``files`` named ``dist`` 0.1.0 (what a package build would produce)."""
    stem = dist.replace("-", "_")
    info = f"{stem}-0.1.0.dist-info"
    contents = {**files,
                f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n",
                f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                 "Tag: py3-none-any\n"}
    record = []
    for name, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    path = directory / f"{stem}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in contents.items():
            archive.writestr(name, text)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two packages, installed by pip (offline) into a directory of their own."""
    root = tmp_path_factory.mktemp("auto")
    tally = {k: v.lstrip("\n") for k, v in STANDIN.items() if k.startswith("tally_env/")}
    plain = {"plain_env/__init__.py": "", "plain_env/client.py": PLAIN_CLIENT}
    wheels = [_wheel(root, "openenv-tally_env", tally), _wheel(root, "openenv-plain-env", plain)]
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--disable-pip-version-check", "--target", str(target),
                    *map(str, wheels)], check=True, capture_output=True, timeout=120)
    write_standin(root / "openenv-standin")
    return root


@pytest.fixture
def installed(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The packages and the stand-in OpenEnv on the path for this test; the tally models."""
    monkeypatch.syspath_prepend(str(site / "openenv-standin"))
    monkeypatch.syspath_prepend(str(site / "site"))
    monkeypatch.delenv("OPENENV_TRUST_REMOTE_CODE", raising=False)
    before = set(sys.modules)
    import tally_env.models

    yield tally_env.models
    for name in set(sys.modules) - before:
        if name.split(".")[0] in STANDIN_PACKAGES:  # envlink's own stay loaded
            del sys.modules[name]


def test_short_names_resolve_to_the_adopted_client_and_its_action(
        installed: ModuleType) -> None:
    """"tally", "tally-env" and "tally_env" name the installed package; its OpenEnv client
    comes back adopted, its action class as it is; an envlink client is kept as it is."""
    classes = {AutoEnv.get_env_class(name) for name in ("tally", "tally-env", "tally_env")}
    assert len(classes) == 1
    TallyEnv = classes.pop()
    assert issubclass(TallyEnv, envlink.EnvClient) and TallyEnv.__name__ == "TallyEnv"
    assert AutoAction.from_env("tally-env") is installed.TallyAction
    assert AutoAction.from_env("tally", skip_install=True) is GenericAction
    info = AutoEnv.get_env_info("tally")
    assert info["package"] == "openenv-tally_env" and info["default_image"] == "tally-env:latest"
    assert info["env_class"] == "TallyEnv" and info["module"] == "tally_env.client"
    assert AutoEnv.get_env_class("plain").__name__ == "PlainEnv"
    assert AutoAction.get_action_info("plain")["action_class"] == "PlainAction"


def test_from_env_with_a_running_server_gives_a_working_client(
        installed: ModuleType, server_thread: ServerThread) -> None:
    """from_env(name, base_url=...) with the server up: a client of the package's class,
    with envlink's options, whose typed episode works."""
    env = AutoEnv.from_env("tally", base_url=server_thread.url, on_session_lost="auto")
    assert type(env).__name__ == "TallyEnv" and env.on_session_lost == "auto"
    with env:
        env.reset()
        result = env.step(installed.TallyAction(message="auto"))
        assert result.observation.echoed_message == "AUTO"


def test_space_names_resolve_to_the_installed_package_and_the_space(
        installed: ModuleType, server_thread: ServerThread) -> None:
    """"owner/space" whose package is installed: the client reaches the Space by name when it
    answers; when it does not, the package's image is run by the container provider, lazily."""
    with override_space_urls({"someone/tally-env": server_thread.url}):
        env = AutoEnv.from_env("someone/tally-env")
        with env:
            env.reset()
            assert env.step(installed.TallyAction(message="hub")).observation.echoed_message \
                == "HUB"
        generic = AutoEnv.from_env("someone/tally-env", skip_install=True)
        assert type(generic) is envlink.GenericEnvClient
        generic.close()

    started: list[str] = []

    class Recorder:
        def start_container(self, image: str, **kwargs: Any) -> str:
            started.append(image)
            return server_thread.url

        def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None: ...

        def stop_container(self) -> None: ...

    dead = f"http://127.0.0.1:{restartable_port()}"
    with override_space_urls({"someone/tally-env": dead}):
        env = AutoEnv.from_env("https://huggingface.co/spaces/someone/tally-env",
                               container_provider=Recorder(), wait_timeout=2.0)
    assert started == []  # nothing starts before the first call
    with env:
        env.reset()
    assert started == ["tally-env:latest"]


def test_unknown_and_untrusted_names_are_value_errors(installed: ModuleType) -> None:
    """An unknown name lists the close ones; a Space whose package is missing is not
    installed without trust (no network is touched)."""
    with pytest.raises(ValueError, match="Did you mean: tally"):
        AutoEnv.from_env("taly")
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoAction.from_env("someone/unknown-space")
    with pytest.raises(TypeError, match="factory"):
        AutoEnv()


def test_skip_install_uses_a_generic_client(installed: ModuleType,
                                            server_thread: ServerThread) -> None:
    """skip_install with a base_url: a GenericEnvClient, with GenericAction as its action;
    a base_url that does not answer is a ConnectionError, as in OpenEnv."""
    env = AutoEnv.from_env("anything", base_url=server_thread.url, skip_install=True)
    assert type(env) is envlink.GenericEnvClient
    action = GenericAction(message="generic")
    assert action == {"message": "generic"} and repr(action) == "GenericAction(message='generic')"
    with env:
        env.reset()
        assert env.step(action).observation["echoed_message"] == "generic"
    with pytest.raises(ConnectionError):
        AutoEnv.from_env("anything", base_url=f"http://127.0.0.1:{restartable_port()}",
                         skip_install=True)
