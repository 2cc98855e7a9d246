"""CAPACITY_REACHED: a typed error carrying the server's session counts."""

from __future__ import annotations

import pytest

from envlink import CapacityReachedError, ErrorCode, GenericEnvClient, ServerError
from envlink._sansio.protocol import ErrorFrame, decode_response
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(30)


async def test_capacity_error_carries_the_servers_counts() -> None:
    """A refused session raises CapacityReachedError with active_sessions and max_sessions."""
    async with EnvServer(env="echo", max_sessions=1) as srv:
        holder = GenericEnvClient(srv.url)
        extra = GenericEnvClient(srv.url)
        try:
            await holder.reset()
            with pytest.raises(CapacityReachedError) as refused:
                await extra.reset()
            assert refused.value.code is ErrorCode.CAPACITY_REACHED
            assert (refused.value.active_sessions, refused.value.max_sessions) == (1, 1)
        finally:
            await holder.close()
            await extra.close()


@pytest.mark.parametrize("extra", ['"active_sessions": "x", "max_sessions": -1', '"x": 1'])
def test_missing_or_junk_counts_are_none(extra: str) -> None:
    """Counts that are absent or not non-negative integers are read as None, not an error."""
    frame = decode_response('{"type": "error", "data": {"message": "full", '
                            f'"code": "CAPACITY_REACHED", {extra}}}}}')
    assert isinstance(frame, ErrorFrame)
    error = ServerError.from_frame(frame.data.message, frame.data.code,
                                   active_sessions=frame.data.active_sessions,
                                   max_sessions=frame.data.max_sessions)
    assert isinstance(error, CapacityReachedError)
    assert (error.active_sessions, error.max_sessions) == (None, None)


def test_other_codes_stay_plain_server_errors() -> None:
    """from_frame ignores the counts for codes other than CAPACITY_REACHED."""
    error = ServerError.from_frame("bad", "EXECUTION_ERROR", active_sessions=1, max_sessions=2)
    assert type(error) is ServerError
