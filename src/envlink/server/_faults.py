"""Fault injection settings for the reference server, and the corrupt frames it sends.

Pure: no I/O. A :class:`Faults` is a plain mutable object; the server reads it on
every upgrade and every request, so tests can change it while the server runs.
One server-wide instance lives at ``EnvServer.faults``, and each connection has its
own at ``ConnectionHandle.faults`` (checked first). One-shot faults (``drop_after``,
``stall_after``, the ``error_frames``/``corrupt_frames``/``refuse`` counts) are
consumed on the instance where they fire.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "CORRUPT_KINDS",
    "DROP_MODES",
    "CorruptKind",
    "DropMode",
    "FaultChain",
    "Faults",
    "corrupt_frame",
]

#: When a dropped connection dies relative to the request that triggered the drop:
#: ``before_apply`` (never applied), ``after_apply`` (applied, answer never sent),
#: ``mid_answer`` (applied, part of the answer's bytes written, then aborted).
DropMode = Literal["before_apply", "after_apply", "mid_answer"]
DROP_MODES: tuple[str, ...] = get_args(DropMode)

#: Kinds of corrupt answer frames.
CorruptKind = Literal[
    "invalid_json", "array", "bad_data", "unknown_type", "missing_field", "oversize", "binary"
]
CORRUPT_KINDS: tuple[str, ...] = get_args(CorruptKind)


@dataclass
class Faults:
    """Faults to inject. Every field may be changed live.

    Attributes:
        latency: seconds added before each answer is sent.
        stall_after: when a connection's Nth request (1-based, counting every frame
            received on that connection; or its first request after that, if set
            late) arrives, stop reading from the socket (so pings go unanswered
            too) and do not answer it, until un-stalled or aborted. One-shot.
        drop_after: when a connection's Nth request arrives (same counting), drop the
            connection (transport abort, no close frame) as ``drop_mode`` says.
            One-shot.
        drop_mode: see :data:`DropMode`.
        error_frames: answer the next N requests with an error frame of
            ``error_code`` instead of applying them.
        error_code: the code of injected error frames.
        corrupt_frames: answer the next N requests with a corrupt frame of
            ``corrupt_kind`` instead of applying them.
        corrupt_kind: see :data:`CorruptKind`.
        oversize_bytes: approximate size of an ``oversize`` corrupt frame.
        refuse: refuse the next N WebSocket upgrades with ``refuse_status``
            (server-wide only, like the other ``refuse*`` fields).
        refuse_until: refuse every upgrade until this ``time.monotonic()`` instant;
            set it with :meth:`refuse_for`.
        refuse_status: HTTP status of refused upgrades.
        retry_after: seconds sent in a ``Retry-After`` header of refused upgrades.
    """

    latency: float = 0.0
    stall_after: int | None = None
    drop_after: int | None = None
    drop_mode: DropMode = "before_apply"
    error_frames: int = 0
    error_code: str = "EXECUTION_ERROR"
    corrupt_frames: int = 0
    corrupt_kind: CorruptKind = "invalid_json"
    oversize_bytes: int = 16 * 1024 * 1024 + 1024
    refuse: int = 0
    refuse_until: float | None = None
    refuse_status: int = 503
    retry_after: float | None = None

    def refuse_for(self, seconds: float) -> None:
        """Refuse every WebSocket upgrade for the next ``seconds`` seconds."""
        self.refuse_until = time.monotonic() + seconds

    def clear(self) -> None:
        """Remove every fault."""
        fresh = Faults()
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))

    # ------------------------------------------------ consumption (used by the server)

    def take_refusal(self) -> bool:
        """Whether to refuse this upgrade; consumes one of ``refuse``."""
        if self.refuse > 0:
            self.refuse -= 1
            return True
        return self.refuse_until is not None and time.monotonic() < self.refuse_until

    def take_stall(self, request_number: int) -> bool:
        """Whether the request numbered ``request_number`` stalls; consumes the fault."""
        if self.stall_after is not None and request_number >= self.stall_after:
            self.stall_after = None
            return True
        return False

    def take_drop(self, request_number: int) -> DropMode | None:
        """The drop mode if this request drops the connection; consumes the fault."""
        if self.drop_after is not None and request_number >= self.drop_after:
            self.drop_after = None
            return self.drop_mode
        return None

    def take_error(self) -> str | None:
        """The code of an injected error frame for this request, if any; consumes one."""
        if self.error_frames > 0:
            self.error_frames -= 1
            return self.error_code
        return None

    def take_corrupt(self) -> CorruptKind | None:
        """The kind of corrupt frame for this request, if any; consumes one."""
        if self.corrupt_frames > 0:
            self.corrupt_frames -= 1
            return self.corrupt_kind
        return None


class FaultChain:
    """The fault decisions for one request: a connection's faults first, then the server's.

    A one-shot fault is consumed on the first instance where it fires; the later
    ones are not consulted (nor consumed) for that decision.
    """

    __slots__ = ("layers",)

    def __init__(self, *layers: Faults) -> None:
        self.layers = layers

    @property
    def latency(self) -> float:
        """Seconds to add before the answer: the sum over the instances."""
        return sum(faults.latency for faults in self.layers)

    def take_stall(self, request_number: int) -> bool:
        """Whether this request stalls the connection."""
        return any(faults.take_stall(request_number) for faults in self.layers)

    def take_drop(self, request_number: int) -> DropMode | None:
        """How this request drops the connection, if it does."""
        for faults in self.layers:
            mode = faults.take_drop(request_number)
            if mode is not None:
                return mode
        return None

    def take_error(self) -> str | None:
        """The code of an error frame to answer instead of applying the request, if any."""
        for faults in self.layers:
            code = faults.take_error()
            if code is not None:
                return code
        return None

    def take_corrupt(self) -> tuple[CorruptKind, int] | None:
        """The kind of corrupt frame to answer instead, with the oversize setting of the
        instance that fired (the connection's own first), if any."""
        for faults in self.layers:
            kind = faults.take_corrupt()
            if kind is not None:
                return kind, faults.oversize_bytes
        return None


def corrupt_frame(kind: CorruptKind, *, request_type: str, request_id: str | None,
                  oversize_bytes: int) -> str | bytes:
    """A frame that violates the protocol in the way ``kind`` names.

    ``binary`` is a binary frame of bytes that are not UTF-8; every other kind is a
    text frame.
    """
    def dump(obj: dict[str, object]) -> str:
        if request_id is not None:
            obj["id"] = request_id
        return json.dumps(obj, separators=(",", ":"))

    if kind == "invalid_json":
        return '{"type": "observation", "data": {'
    if kind == "array":
        return "[1, 2, 3]"
    if kind == "bad_data":
        return dump({"type": "state" if request_type == "state" else "observation",
                     "data": "oops"})
    if kind == "unknown_type":
        return dump({"type": "surprise", "data": {}})
    if kind == "missing_field":
        if request_type == "state":
            return dump({"type": "state"})
        return dump({"type": "observation", "data": {"reward": 0.0, "done": False}})
    if kind == "oversize":
        return dump({"type": "observation",
                     "data": {"observation": {"blob": "x" * oversize_bytes},
                              "reward": 0.0, "done": False}})
    if kind == "binary":
        return b"\xff\xfe\x00not-utf8\x80"
    raise ValueError(f"unknown corrupt frame kind {kind!r}")
