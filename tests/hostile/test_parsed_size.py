"""A hostile server's frame is bounded by what it costs parsed, not only by its length."""

from __future__ import annotations

import pytest

from envlink import ProtocolError
from envlink._sansio.protocol import decode_response

from ._memory import MIB, self_peak_rss

pytestmark = pytest.mark.timeout(30)


def test_an_observation_of_nine_million_empty_objects_is_refused_unparsed() -> None:
    """27 MiB of `{}` (about 650 MiB once parsed) is a ProtocolError; memory stays bounded."""
    frame = ('{"type":"observation","data":{"observation":{"x":['
             + "{}," * (9 * 1024 * 1024) + '{}]},"reward":0,"done":false}}')
    before = self_peak_rss()
    with pytest.raises(ProtocolError, match="JSON values"):
        decode_response(frame, max_size=None)
    assert self_peak_rss() - before < 64 * MIB


def test_a_large_frame_of_few_values_still_decodes() -> None:
    """A 20 MiB string observation (one value) is not refused by the value count."""
    frame = ('{"type":"observation","data":{"observation":{"x":"' + "a" * (20 * MIB)
             + '"},"reward":0,"done":false}}')
    decoded = decode_response(frame, max_size=None)
    assert len(decoded.data.observation["x"]) == 20 * MIB  # type: ignore[union-attr]
