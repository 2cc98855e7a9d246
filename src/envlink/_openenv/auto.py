"""``AutoEnv``, ``AutoAction`` and ``GenericAction``: environments by name, as OpenEnv 0.10.

Names resolve as OpenEnv's ``openenv.auto`` resolves them:

- a short name (``"coding"``, ``"coding-env"``, ``"coding_env"``) names an installed
  ``openenv-*`` distribution (``openenv-coding_env`` → module ``coding_env``); its
  ``openenv.yaml`` may rename the environment and its action and observation
  classes, which live in ``<module>.client`` (``CodingEnv``, ``CodingAction``...);
- an ``owner/space`` name (or a ``huggingface.co`` URL) names a Hugging Face Space
  whose package is ``openenv-<space>`` (``-`` → ``_``, ``_env`` added); if it is not
  installed it is installed from the Space with pip, only when trusted
  (``trust_remote_code=True``, ``OPENENV_TRUST_REMOTE_CODE=1``, or a ``y`` typed at
  a terminal prompt).

The client class found is adopted (:func:`~envlink.adopt`) when it is an OpenEnv
client, so what comes back is always an envlink client. Unlike OpenEnv, nothing is
connected or started here: a container starts on the client's first call (it is
the client's provider), and a Space is reached by name, so a token goes only to it.
Discovery reads the installed distributions each time (OpenEnv keeps a cache file).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.resources
import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from envlink._client.client import EnvClient, GenericEnvClient
from envlink._errors import EnvlinkError
from envlink._launch.providers import DockerProvider, bound_container
from envlink._launch.spaces import hf_space_subdomain, is_space_name
from envlink._openenv.adopt import adopt, is_openenv_client
from envlink._sansio.policies import ReconnectPolicy

__all__ = ["AutoAction", "AutoEnv", "EnvironmentInfo", "GenericAction", "discover"]

_log = logging.getLogger("envlink.auto")
_E = TypeVar("_E", bound=EnvClient[Any, Any, Any])

#: Set to 1 (or true, yes) to install a Space's package without asking (OpenEnv's name).
TRUST_REMOTE_CODE_ENV = "OPENENV_TRUST_REMOTE_CODE"
_PREFIX = "openenv-"
_HUB_HOST = "huggingface.co"


class GenericAction(dict[str, Any]):
    """An action for :class:`~envlink.GenericEnvClient`: a dict built from keyword arguments.

    ``GenericAction(code="print(1)", timeout=30)`` is ``{"code": "print(1)", "timeout": 30}``,
    as OpenEnv's ``GenericAction``.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(kwargs)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.items())
        return f"GenericAction({fields})"


@dataclass(frozen=True)
class EnvironmentInfo:
    """An installed environment package, as OpenEnv's discovery describes it."""

    env_key: str
    name: str
    package_name: str
    version: str
    description: str
    client_module_path: str
    client_class_name: str
    action_class_name: str
    observation_class_name: str
    default_image: str
    spec_version: int | None = None

    def _attribute(self, name: str) -> Any:
        try:
            module = importlib.import_module(self.client_module_path)
        except ImportError as exc:
            raise ImportError(f"could not import {self.client_module_path} of package "
                              f"{self.package_name!r}: {exc}") from exc
        try:
            return getattr(module, name)
        except AttributeError:
            raise ImportError(f"{self.client_module_path} (package {self.package_name!r}) "
                              f"has no {name}") from None

    def get_client_class(self) -> type[EnvClient[Any, Any, Any]]:
        """The package's client class, as an envlink client (adopted if it is OpenEnv's).

        Raises:
            ImportError: the module or the class cannot be imported.
            TypeError: the class is neither an OpenEnv nor an envlink client.
        """
        found = self._attribute(self.client_class_name)
        if isinstance(found, type) and issubclass(found, EnvClient):
            return found
        if is_openenv_client(found):
            return cast("type[EnvClient[Any, Any, Any]]", adopt(found))
        raise TypeError(f"{self.client_module_path}.{self.client_class_name} is not an "
                        "OpenEnv or envlink client class")

    def get_action_class(self) -> type[Any]:
        """The package's action class.

        Raises:
            ImportError: the module or the class cannot be imported.
        """
        return self._attribute(self.action_class_name)  # type: ignore[no-any-return]

    def get_observation_class(self) -> type[Any]:
        """The package's observation class.

        Raises:
            ImportError: the module or the class cannot be imported.
        """
        return self._attribute(self.observation_class_name)  # type: ignore[no-any-return]


def _normalize(name: str) -> str:
    """``"echo"``, ``"echo-env"``, ``"echo_env"`` → ``"echo_env"`` (OpenEnv's rule)."""
    name = re.sub(r"[-_]env$", "", name).replace("-", "_")
    return name if name.endswith("_env") else f"{name}_env"


def _class_name(env_name: str, suffix: str) -> str:
    base = env_name.replace("_env", "")
    return "".join(word.capitalize() for word in base.split("_")) + suffix


def _manifest(module: str) -> dict[str, str]:
    """The top-level scalars of the package's ``openenv.yaml`` (empty when absent)."""
    try:
        text = (importlib.resources.files(module) / "openenv.yaml").read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError, NotADirectoryError, TypeError):
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        _log.warning("envlink.auto_manifest_unreadable: %s: %s", module, exc)
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z_][\w-]*)\s*:\s*(.*?)\s*$", line)
        if match and match.group(2) and not match.group(2).startswith("#"):
            value = match.group(2).split(" #", 1)[0].strip()
            values[match.group(1)] = value.strip("'\"")
    return values


def _info(package: str, version: str) -> EnvironmentInfo:
    module = package[len(_PREFIX):].replace("-", "_")
    manifest = _manifest(module)
    env_name = manifest.get("name", module)
    if not env_name.endswith("_env"):
        env_name = f"{env_name}_env"
    custom = "action" in manifest and "observation" in manifest
    spec = manifest.get("spec_version")
    return EnvironmentInfo(
        env_key=env_name.replace("_env", ""), name=env_name, package_name=package,
        version=version, description=manifest.get("description", f"{env_name} environment"),
        client_module_path=f"{module}.client",
        client_class_name=_class_name(env_name, "Env"),
        action_class_name=manifest["action"] if custom else _class_name(env_name, "Action"),
        observation_class_name=(manifest["observation"] if custom
                                else _class_name(env_name, "Observation")),
        default_image=f"{env_name.replace('_', '-')}:latest",
        spec_version=int(spec) if spec and spec.isdigit() else None)


def discover() -> dict[str, EnvironmentInfo]:
    """The installed environment packages (``openenv-*`` distributions), by key (``"echo"``)."""
    importlib.invalidate_caches()
    found: dict[str, EnvironmentInfo] = {}
    for dist in importlib.metadata.distributions():
        package = dist.metadata["Name"] or ""
        if not package.startswith(_PREFIX) or package == "openenv-core":
            continue
        info = _info(package, dist.version)
        found.setdefault(info.env_key, info)
    return found


def _lookup(name: str) -> EnvironmentInfo | None:
    return discover().get(_normalize(name).replace("_env", ""))


def _installed(name: str) -> EnvironmentInfo:
    """The installed environment ``name``; ``ValueError`` where there is none."""
    info = _lookup(name)
    if info is None:
        raise ValueError(f"Unknown environment: {name}")
    return info


def _unknown(name: str, factory: str) -> ValueError:
    known = discover()
    if not known:
        return ValueError("No OpenEnv environments found.\nInstall an environment with: "
                          "pip install openenv-<env-name>\nOr name a Hugging Face Space: "
                          f"{factory}.from_env('owner/space')")
    key = _normalize(name).replace("_env", "")
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
    hint = f"Did you mean: {', '.join(close)}?\n" if close else ""
    return ValueError(f"Unknown environment '{name}'.\n{hint}"
                      f"Available environments: {', '.join(sorted(known))}")


def _is_hub_name(name: str) -> bool:
    return "/" in name or _HUB_HOST in name


def _repo_id(name: str) -> str:
    """``owner/space`` of a Space name or a ``huggingface.co`` URL."""
    if _HUB_HOST in name:
        parts = [p for p in name.split("/") if p]
        return "/".join(parts[-2:])
    return name


def _trusted(repo_id: str, trust_remote_code: bool) -> bool:
    if trust_remote_code:
        return True
    if os.environ.get(TRUST_REMOTE_CODE_ENV, "").lower() in ("1", "true", "yes"):
        return True
    if not sys.stdin.isatty():
        return False
    print(f"Install and run code from https://huggingface.co/spaces/{repo_id}? "
          "Only proceed if you trust the source.")
    try:
        return input("Do you want to proceed? [y/N]: ").strip().lower() in ("y", "yes")
    except (EOFError, KeyboardInterrupt):
        return False


def _package_from_hub(name: str, trust_remote_code: bool) -> str:
    """The environment name of Space ``name``'s package, installing it if it is missing.

    Raises:
        ValueError: the package is missing and installing it was not trusted, or failed.
    """
    repo_id = _repo_id(name)
    expected = _normalize(repo_id.split("/")[-1])
    try:
        importlib.metadata.distribution(f"{_PREFIX}{expected}")
        return expected
    except importlib.metadata.PackageNotFoundError:
        pass
    if not _trusted(repo_id, trust_remote_code):
        raise ValueError(f"{repo_id}'s package ({_PREFIX}{expected}) is not installed, and "
                         "installing remote code was not allowed: pass trust_remote_code=True "
                         f"or set {TRUST_REMOTE_CODE_ENV}=1")
    before = set(discover())
    url = f"git+https://huggingface.co/spaces/{repo_id}"
    command = [sys.executable, "-m", "pip", "install", url]
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ValueError(f"Failed to install environment from Hugging Face Space {repo_id}:\n"
                         f"{' '.join(command)}\n{(done.stderr or done.stdout)[-2000:]}")
    new = set(discover()) - before
    return f"{sorted(new)[0]}_env" if new else expected


def _available(url: str, timeout: float) -> bool:
    """Whether the server at ``url`` (or Space name) answers ``GET /health`` healthy now."""
    probe = GenericEnvClient(url, reconnect=ReconnectPolicy(max_attempts=1)).sync()
    try:
        probe.health(timeout=timeout)
        return True
    except (EnvlinkError, ValueError):
        return False
    finally:
        probe.close()


def _is_local(url: str) -> bool:
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "0.0.0.0", "::1") or host.startswith("127.")


def _in_container(cls: type[_E], image: str, provider: Any,
                  env_vars: dict[str, str] | None, kwargs: dict[str, Any]) -> _E:
    """A client whose provider runs ``image`` on its first call."""
    chosen = provider if provider is not None else DockerProvider()
    return cls(provider=bound_container(chosen, image, {"env_vars": dict(env_vars or {})}),
               **kwargs)


class AutoEnv:
    """An envlink client for an environment named as OpenEnv's ``AutoEnv`` names them.

    Example::

        env = AutoEnv.from_env("coding", base_url="http://127.0.0.1:8000")
        env = AutoEnv.from_env("openenv/coding_env")  # the Space (or its image)

    Not instantiable: use the class methods.
    """

    def __init__(self) -> None:
        raise TypeError("AutoEnv is a factory class and should not be instantiated directly. "
                        "Use AutoEnv.from_env() or AutoEnv.from_hub() instead.")

    @classmethod
    def from_env(cls, name: str, base_url: str | None = None, docker_image: str | None = None,
                 container_provider: Any = None, wait_timeout: float = 30.0,
                 env_vars: dict[str, str] | None = None, trust_remote_code: bool = False,
                 skip_install: bool = False, **kwargs: Any) -> EnvClient[Any, Any, Any]:
        """The client of environment ``name``: a short name, or a Space (``owner/space``).

        With ``base_url``, a server answering there is used; a local one that does not
        answer is started from the image instead; a remote one is an error. A Space
        that answers is used by name; otherwise its image (or ``docker_image``) runs in
        ``container_provider`` (default :class:`~envlink.DockerProvider`), started by
        the client's first call. ``skip_install`` uses a
        :class:`~envlink.GenericEnvClient` and installs nothing.

        Args:
            name: ``"coding"`` / ``"coding-env"`` / ``"coding_env"``, ``"owner/space"``
                or a ``huggingface.co`` URL.
            base_url: a server to use.
            docker_image: the image to run (default: the package's, ``<name>-env:latest``).
            container_provider: runs the image.
            wait_timeout: seconds a server gets to answer the availability probe.
            env_vars: the container's environment.
            trust_remote_code: install a missing Space package without asking.
            skip_install: connect with a generic client, installing nothing.
            **kwargs: options of the client (``on_session_lost=``, ``timeout=``...).

        Raises:
            ValueError: an unknown environment, a refused install, or no way to reach
                the server (OpenEnv raises ``ValueError`` there too).
            ConnectionError: ``skip_install`` and ``base_url`` does not answer.
            ImportError: the package is installed but its client cannot be imported.
        """
        probe = min(wait_timeout, 5.0)
        if skip_install:
            return cls._generic(name, base_url, docker_image, container_provider, env_vars,
                                probe, kwargs)
        space: str | None = None
        if _is_hub_name(name):
            repo_id = _repo_id(name)
            if is_space_name(repo_id) and base_url is None and _available(repo_id, probe):
                space = repo_id
            env_name = _package_from_hub(name, trust_remote_code)
        else:
            env_name = name
        info = _lookup(env_name)
        if info is None:
            raise _unknown(env_name, "AutoEnv")
        client_class = info.get_client_class()
        image = docker_image or info.default_image
        if space is not None:
            return client_class(space, **kwargs)
        if base_url is None:
            return _in_container(client_class, image, container_provider, env_vars, kwargs)
        if _available(base_url, probe):
            return client_class(base_url, **kwargs)
        if _is_local(base_url):
            return _in_container(client_class, image, container_provider, env_vars, kwargs)
        raise ValueError(f"Failed to create environment client for '{env_name}': remote "
                         f"server not available at {base_url}")

    @classmethod
    def _generic(cls, name: str, base_url: str | None, docker_image: str | None,
                 provider: Any, env_vars: dict[str, str] | None, probe: float,
                 kwargs: dict[str, Any]) -> GenericEnvClient:
        if base_url:
            if _available(base_url, probe):
                return GenericEnvClient(base_url, **kwargs)
            raise ConnectionError(f"Server not available at {base_url}. "
                                  "Please ensure the server is running.")
        if _is_hub_name(name):
            repo_id = _repo_id(name)
            if _available(repo_id, probe):
                return GenericEnvClient(repo_id, **kwargs)
            image = f"registry.hf.space/{hf_space_subdomain(repo_id)}:latest"
            return _in_container(GenericEnvClient, image, provider, env_vars,
                                 kwargs)
        if docker_image:
            return _in_container(GenericEnvClient, docker_image, provider, env_vars,
                                 kwargs)
        raise ValueError(f"Cannot use skip_install=True for local environment '{name}' "
                         "without base_url or docker_image")

    @classmethod
    def from_hub(cls, name: str, **kwargs: Any) -> EnvClient[Any, Any, Any]:
        """Same as :meth:`from_env` (OpenEnv's older name)."""
        return cls.from_env(name, **kwargs)

    @classmethod
    def get_env_class(cls, name: str) -> type[EnvClient[Any, Any, Any]]:
        """The envlink client class of installed environment ``name``.

        Raises:
            ValueError: no such environment is installed.
        """
        info = _installed(name)
        return info.get_client_class()

    @classmethod
    def get_env_info(cls, name: str) -> dict[str, Any]:
        """What discovery knows of installed environment ``name`` (OpenEnv's keys).

        Raises:
            ValueError: no such environment is installed.
        """
        info = _installed(name)
        return {"env_key": info.env_key, "name": info.name, "package": info.package_name,
                "version": info.version, "description": info.description,
                "env_class": info.client_class_name, "action_class": info.action_class_name,
                "observation_class": info.observation_class_name,
                "module": info.client_module_path, "default_image": info.default_image,
                "spec_version": info.spec_version}

    @classmethod
    def list_environments(cls) -> None:
        """Print the installed environments."""
        found = discover()
        print("Available OpenEnv Environments:")
        print("-" * 70)
        for key in sorted(found):
            info = found[key]
            print(f"  {key:<15}: {info.description} (v{info.version})")
            print(f"                   Package: {info.package_name}")
        if not found:
            print("  No OpenEnv environments found.")
        print("-" * 70)
        print(f"Total: {len(found)} environments")


class AutoAction:
    """The action class of an environment named as OpenEnv's ``AutoAction`` names them.

    Not instantiable: use the class methods.
    """

    def __init__(self) -> None:
        raise TypeError("AutoAction is a factory class and should not be instantiated "
                        "directly. Use AutoAction.from_env() or AutoAction.from_hub() instead.")

    @classmethod
    def from_env(cls, name: str, skip_install: bool = False,
                 trust_remote_code: bool = False) -> type[Any]:
        """The action class of environment ``name`` (:class:`GenericAction` with
        ``skip_install``).

        Raises:
            ValueError: an unknown environment, or a refused install.
            ImportError: the package's client module or its action class is missing.
        """
        if skip_install:
            return GenericAction
        env_name = (_package_from_hub(name, trust_remote_code) if _is_hub_name(name)
                    else name)
        info = _lookup(env_name)
        if info is None:
            raise _unknown(env_name, "AutoAction")
        return info.get_action_class()

    @classmethod
    def from_hub(cls, env_name: str, skip_install: bool = False) -> type[Any]:
        """Same as :meth:`from_env` (OpenEnv's older name)."""
        return cls.from_env(env_name, skip_install=skip_install)

    @classmethod
    def get_action_info(cls, name: str) -> dict[str, Any]:
        """The action and observation class names of installed environment ``name``.

        Raises:
            ValueError: no such environment is installed.
        """
        info = _installed(name)
        return {"env_key": info.env_key, "env_name": info.name, "package": info.package_name,
                "action_class": info.action_class_name,
                "observation_class": info.observation_class_name,
                "module": info.client_module_path}

    @classmethod
    def list_actions(cls) -> None:
        """Print the action class of each installed environment."""
        found = discover()
        print("Available Action Classes:")
        print("-" * 70)
        for key in sorted(found):
            print(f"  {key:<15}: {found[key].action_class_name}")
            print(f"                   Package: {found[key].package_name}")
        print("-" * 70)
        print(f"Total: {len(found)} action classes")
