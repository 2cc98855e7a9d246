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
        "StepResult", "Transition", "main",
    ])
    for name in envlink.server.__all__:
        assert getattr(envlink.server, name) is not None


def test_step_result_is_the_earlier_name_of_transition() -> None:
    """envlink.server.StepResult still works: it is Transition, not the client's class."""
    import envlink

    assert envlink.server.StepResult is envlink.server.Transition
    assert envlink.server.Transition is not envlink.StepResult
