"""shorten(): envlink's own frames leave an error's traceback, but the innermost; anyone
else's frames stay; each exception it was raised from keeps its innermost frame."""

from __future__ import annotations

import traceback

import pytest

from envlink import InvalidActionError
from envlink._errors import shorten
from envlink._sansio.protocol import encode_call

pytestmark = pytest.mark.timeout(30)


def _callers_helper() -> None:
    encode_call("step", {"handle": object()}, None)


def _frames(error: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(error.__traceback__)]


def test_envlink_frames_go_but_the_origin_and_the_callers_stay() -> None:
    """encode_call's frame goes; the test's, the helper's and _dump's (the raise) stay."""
    with pytest.raises(InvalidActionError) as info:
        _callers_helper()
    error = info.value
    assert _frames(error)[-3:] == ["_callers_helper", "encode_call", "_dump"]
    assert shorten(error) is error
    assert _frames(error)[-2:] == ["_callers_helper", "_dump"]
    assert "test_envlink_frames_go_but_the_origin_and_the_callers_stay" in _frames(error)


def test_the_root_cause_keeps_its_innermost_frame_and_its_message() -> None:
    """A chained cause keeps only the frame that raised it; type and message unchanged."""

    def deep() -> None:
        raise OSError(111, "Connect call failed")

    def middle() -> None:
        deep()

    try:
        try:
            middle()
        except OSError as exc:
            raise InvalidActionError("action", "boom") from exc
    except InvalidActionError as error:
        shorten(error)
        cause = error.__cause__
        assert isinstance(cause, OSError) and cause.strerror == "Connect call failed"
        assert _frames(cause) == ["deep"]
