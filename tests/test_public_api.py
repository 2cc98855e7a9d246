"""The public surface: every public name importable from envlink, and __all__ everywhere."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import envlink

pytestmark = pytest.mark.timeout(30)

EXPECTED = {
    # clients and results
    "EnvClient", "GenericEnvClient", "SyncEnvClient", "StepResult", "State",
    "CallToolAction", "ListToolsAction", "CallToolObservation", "ListToolsObservation",
    "MCPClientBase", "MCPToolClient", "MCPObservation", "Tool", "ToolError", "ToolErrorType",
    # existing environment packages: their OpenEnv clients, adopted
    "adopt", "AutoEnv", "AutoAction", "GenericAction",
    # configuration and policies
    "ClientConfig", "Timeout", "UNSET", "ConnectionOptions", "ReconnectPolicy", "RetryBudget",
    "SessionLostPolicy", "set_testing", "EpisodeJournal", "JournalEntry",
    "Limits", "set_limits", "get_limits", "SessionHandle", "FleetLimits",
    # testing without a server
    "MockTransport",
    # rollouts on disk
    "RolloutRecorder",
    # the bridge
    "Bridge", "SyncProxy", "default_bridge",
    # many sessions
    "EnvPool", "SyncEnvPool", "Batch", "PoolView", "EndpointView", "AutoresetMode",
    # telemetry
    "configure",
    # where the server comes from: providers, Spaces, readiness and discovery
    "LocalServerProvider", "DockerProvider", "Bootstrap", "hf_space_subdomain",
    "Health", "EnvironmentMetadata", "EnvironmentSchema",
    # errors
    "EnvlinkError", "ConnectError", "HandshakeRejectedError", "ConnectionLostError",
    "OutcomeUnknownError", "CallTimeoutError", "ServerError", "CapacityReachedError",
    "ErrorCode", "ProtocolError", "SessionLostError", "ReplayDivergedError",
    "RetryBudgetExhaustedError", "ClientClosedError", "ReentrantCallError", "ToolCallError",
    "ServerValidationError", "FactoryError", "SessionError", "McpError", "SessionGoneError",
    "ExecutionModeError", "FleetStoreError",
    "FeatureUnavailableError",
    "NotReadyError", "SpaceNotAwakeError", "ProviderError", "HttpStatusError",
    "InvalidArgumentError",
    "InvalidURLError",
    "InvalidActionError",
    # the harness stream
    "HarnessClient", "HarnessEvent", "HarnessEventType", "HarnessProtocolError",
    "HarnessTurnError",
    "__version__",
}

#: Names public submodules own, still importable from envlink as the same objects.
ALIASES = {
    # observing a client or a bridge
    "CallStarted": "envlink.hooks", "CallFinished": "envlink.hooks",
    "PhaseStarted": "envlink.hooks", "PhaseFinished": "envlink.hooks",
    "ClientEvent": "envlink.hooks", "ClientHook": "envlink.hooks",
    "BridgeHook": "envlink.hooks", "BridgeCallStarted": "envlink.hooks",
    "BridgeCallFinished": "envlink.hooks",
    # the echo environment's client
    "EchoEnv": "envlink.echo_env", "EchoObservation": "envlink.echo_env",
}


def test_top_level_exports_exactly_the_public_names() -> None:
    """envlink.__all__ is exactly the documented public surface, and each name resolves."""
    assert set(envlink.__all__) == EXPECTED
    for name in envlink.__all__:
        assert getattr(envlink, name) is not None


def test_submodule_names_stay_importable_from_envlink() -> None:
    """Each name a public submodule owns is listed there, is the same object at the top
    level (and by `from envlink import`), and is left out of envlink.__all__."""
    for name, module_name in ALIASES.items():
        module = importlib.import_module(module_name)
        assert name in module.__all__, (module_name, name)
        assert getattr(envlink, name) is getattr(module, name), name
        assert name in dir(envlink), name
        namespace: dict[str, object] = {}
        exec(f"from envlink import {name}", namespace)
        assert namespace[name] is getattr(module, name), name
    assert not set(ALIASES) & set(envlink.__all__)


def _isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions (ruff's and isort's order for __all__)."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_grouped_and_sorted_within_each_group() -> None:
    """envlink.__all__ in __init__.py is groups under a comment each, each group sorted."""
    source = Path(envlink.__file__).read_text(encoding="utf-8")
    body = source.split("\n__all__ = [\n", 1)[1].split("\n]", 1)[0].splitlines()
    groups: list[list[str]] = [[]]
    comments = 0
    for line in (line.strip() for line in body):
        if line.startswith("#"):
            groups.append([])
            comments += 1
        elif line:
            groups[-1].append(line.strip('",'))
    assert groups[0] == ["__version__"]
    assert comments >= 8 and all(groups[1:])
    for group in groups:
        assert group == sorted(group, key=_isort_key), group
    assert [n for group in groups for n in group] == envlink.__all__


def test_the_task_api_is_off_the_client() -> None:
    """The Task API is client.tasks only: OpenEnv 0.10's EnvClient has none of these
    calls, so EnvClient keeps no alias of them."""
    client = envlink.GenericEnvClient(base_url="http://127.0.0.1:9")
    for name in ("list_environments", "splits", "num_tasks", "task", "task_range"):
        assert not hasattr(client, name), name
    assert not callable(client.tasks)
    assert {n for n in dir(client.tasks) if not n.startswith("_")} == {
        "list_environments", "splits", "num_tasks", "list_tasks", "get_task", "get_task_range"}


def _ray_installed() -> bool:
    spec = importlib.util.find_spec("ray")
    return spec is not None and spec.origin is not None  # not tests/ray (a namespace)


def test_every_module_declares_all() -> None:
    """Each module of the package has __all__, and every listed name exists."""
    for info in pkgutil.walk_packages(envlink.__path__, "envlink."):
        if info.name.endswith("__main__"):
            continue
        if info.name == "envlink.ray" and not _ray_installed():
            continue  # the optional extra is not installed (tests/ray pins its names)
        if info.name == "envlink.integrations.verifiers" and \
                importlib.util.find_spec("verifiers") is None:
            continue  # subclasses verifiers' classes; .ci/verifiers.sh tests it with them
        if info.name == "envlink._transports.picows_ws" and \
                importlib.util.find_spec("picows") is None:
            continue  # the fast extra is not installed (the dependency floors' run)
        module = importlib.import_module(info.name)
        assert hasattr(module, "__all__"), info.name
        for name in module.__all__:
            assert hasattr(module, name), f"{info.name}.{name}"
