"""Coverage-guided fuzz target: the reference server's dispatch of one received frame.

Any input must end in a reply (an answer or an error frame) without an exception
escaping: a hostile client never crashes a session's handler. Run it with atheris::

    python tests/fuzz/fuzz_dispatch.py -max_total_time=10       # the bounded CI run
    python tests/fuzz/fuzz_dispatch.py -max_total_time=3600 tests/fuzz/corpus/dispatch
"""

from __future__ import annotations

import json

import atheris
from _fuzzing import fuzz  # the script's own folder is on sys.path

with atheris.instrument_imports(include=["envlink"]):
    from envlink.server._environments.deterministic import DeterministicEnvironment
    from envlink.server._environments.echo import EchoEnvironment
    from envlink.server._frames import dispatch
    from envlink.server._store import Session

SEEDS = [
    b'{"type":"reset","data":{"seed":1}}',
    b'{"type":"step","data":{"message":"hi"}}',
    b'{"type":"step","id":"r1","data":{"move":2}}',
    b'{"type":"state"}',
    b'{"type":"close"}',
    b'{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"tools/list"}}',
    b"[1,2,3]",
]


def test_one(data: bytes) -> None:
    """Dispatch ``data`` (as text and as bytes) to an echo and a deterministic session."""
    for env, extensions in ((EchoEnvironment(), False), (DeterministicEnvironment(), True)):
        session = Session(id="s", env=env, extensions=extensions)
        for raw in (data.decode("utf-8", "replace"), data):
            reply = dispatch(session, raw)
            if isinstance(reply.answer, str):
                json.loads(reply.answer)  # every answer is JSON


def main() -> None:
    """Fuzz from the seeds, written into the corpus directory given (if it is empty)."""
    fuzz(test_one, SEEDS)


if __name__ == "__main__":
    main()
