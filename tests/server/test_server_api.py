"""The public surface of envlink.server."""

from __future__ import annotations

import envlink.server


def test_exports() -> None:
    """envlink.server exports exactly the documented names."""
    assert sorted(envlink.server.__all__) == sorted([
        "CORRUPT_KINDS", "DEFAULT_MAX_MESSAGE_SIZE", "DROP_MODES", "ENVIRONMENTS",
        "ActionRejectedError", "ConnectionHandle", "CorruptKind", "DeterministicEnvironment",
        "DropMode", "EchoEnvironment", "EnvServer", "Environment", "EnvironmentFactory", "Faults",
        "InvalidActionError", "ServerThread", "SessionInfo", "SnapshotEnvironment",
        "StepResult", "Transition", "main",
    ])
    for name in envlink.server.__all__:
        assert getattr(envlink.server, name) is not None


def test_invalid_action_error_is_the_earlier_name_of_action_rejected_error() -> None:
    """envlink.server.InvalidActionError still works: it is ActionRejectedError, defined
    with the other exceptions, and not the client's InvalidActionError."""
    import envlink
    from envlink import _errors

    assert envlink.server.InvalidActionError is envlink.server.ActionRejectedError
    assert envlink.server.ActionRejectedError is _errors.ActionRejectedError
    assert envlink.server.ActionRejectedError is not envlink.InvalidActionError


def test_step_result_is_the_earlier_name_of_transition() -> None:
    """envlink.server.StepResult still works: it is Transition, not the client's class."""
    import envlink

    assert envlink.server.StepResult is envlink.server.Transition
    assert envlink.server.Transition is not envlink.StepResult
