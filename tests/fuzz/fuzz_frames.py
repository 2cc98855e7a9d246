"""Coverage-guided fuzz target: the client's frame decoder.

Any input must end in a decoded frame or a ``ProtocolError`` (an ``EnvlinkError``);
anything else (a foreign exception, a crash) is a finding. Run it with atheris::

    python tests/fuzz/fuzz_frames.py -max_total_time=10       # the bounded CI run
    python tests/fuzz/fuzz_frames.py -max_total_time=3600 tests/fuzz/corpus/frames
"""

from __future__ import annotations

import contextlib

import atheris
from _fuzzing import fuzz  # the script's own folder is on sys.path

with atheris.instrument_imports(include=["envlink"]):
    from envlink._errors import EnvlinkError
    from envlink._sansio.policies import ReconnectPolicy
    from envlink._sansio.protocol import decode_response
    from envlink._sansio.session import SessionCore

SEEDS = [
    b'{"type":"observation","data":{"observation":{"echoed_message":"hi"},"reward":0.5,'
    b'"done":false}}',
    b'{"type":"state","data":{"step_count":3,"episode_id":"e"}}',
    b'{"type":"error","data":{"message":"full","code":"CAPACITY_REACHED","active_sessions":2,'
    b'"max_sessions":2}}',
    b'{"type":"observation","id":"r1","data":{"observation":{},"reward":NaN,"done":true}}',
    b'{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}',
]


def test_one(data: bytes) -> None:
    """Decode ``data`` as a text frame and as a binary one, and through the session core."""
    text = data.decode("utf-8", "replace")
    for raw in (text, data):
        with contextlib.suppress(EnvlinkError):
            decode_response(raw, max_size=1 << 20, max_values=1 << 16)
    core = SessionCore(policy=ReconnectPolicy())
    with contextlib.suppress(EnvlinkError):
        core.receive(text, "r1", 1 << 20, 1 << 16)


def main() -> None:
    """Fuzz from the seeds, written into the corpus directory given (if it is empty)."""
    fuzz(test_one, SEEDS)


if __name__ == "__main__":
    main()
