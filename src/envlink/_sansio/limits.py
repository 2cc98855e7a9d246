"""Bounds on what a parsed JSON message costs, not only on its length.

A message's length does not bound its memory once parsed: ``[{},{},...]`` spends
about 70 bytes of Python objects per 3 bytes of text, so a 15 MiB message can cost
over 800 MiB. Before parsing a large message, both sides count an upper bound on
its JSON values (every value but the first follows a ``[``, ``,`` or ``:``) and
refuse it past a limit: the message is dropped, never parsed.
"""

from __future__ import annotations

from envlink._errors import ProtocolError

__all__ = ["DEFAULT_MAX_MESSAGE_VALUES", "SERVER_MAX_MESSAGE_VALUES", "check_json_values",
           "json_values_bound"]

#: The client's default: at most about 600 MiB of parsed objects in the worst case
#: (a nested list of 8 million small numbers, e.g. a large image, still fits).
DEFAULT_MAX_MESSAGE_VALUES = 8 * 1024 * 1024
#: The reference server's default: requests are small; about 70 MiB at worst.
SERVER_MAX_MESSAGE_VALUES = 1024 * 1024

# Below this length a message cannot cost much whatever it holds: no count.
_UNCOUNTED = 64 * 1024


def json_values_bound(raw: str | bytes) -> int:
    """An upper bound on the number of JSON values in ``raw`` (strings may inflate it)."""
    if isinstance(raw, str):
        return 1 + raw.count("[") + raw.count(",") + raw.count(":")
    return 1 + raw.count(b"[") + raw.count(b",") + raw.count(b":")


def check_json_values(raw: str | bytes, max_values: int | None, what: str = "message") -> None:
    """Refuse ``raw`` before parsing if it may hold more than ``max_values`` JSON values.

    Raises:
        ProtocolError: the bound exceeds ``max_values``.
    """
    if max_values is None or len(raw) <= _UNCOUNTED or len(raw) <= max_values:
        return
    bound = json_values_bound(raw)
    if bound > max_values:
        raise ProtocolError(f"{what} of {len(raw)} bytes may hold {bound} JSON values, more "
                            f"than the limit of {max_values} (not parsed)")
