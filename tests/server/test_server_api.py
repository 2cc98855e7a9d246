"""The public surface of envlink.server."""

from __future__ import annotations

import envlink.server


def test_exports() -> None:
    """envlink.server exports exactly the documented names."""
    assert sorted(envlink.server.__all__) == sorted([
        "CORRUPT_KINDS", "DEFAULT_MAX_MESSAGE_SIZE", "DROP_MODES", "ENVIRONMENTS",
        "ConnectionHandle", "CorruptKind", "DeterministicEnvironment", "DropMode",
        "EchoEnvironment", "EnvServer", "Environment", "EnvironmentFactory", "Faults",
        "InvalidActionError", "ServerThread", "SessionInfo", "SnapshotEnvironment",
        "StepResult", "main",
    ])
    for name in envlink.server.__all__:
        assert getattr(envlink.server, name) is not None
