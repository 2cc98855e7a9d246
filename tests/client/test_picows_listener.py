"""The picows transport's listener: messages that arrive before ``recv()`` are queued in
order, and an idle connection keeps no queue and no ``__dict__`` (memory per idle
session)."""

from __future__ import annotations

import asyncio

import pytest

picows_ws = pytest.importorskip("envlink._transports.picows_ws")

pytestmark = pytest.mark.timeout(10)


async def test_messages_before_recv_come_out_in_order_and_the_queue_goes() -> None:
    listener = picows_ws._Listener(1 << 20)
    assert listener.messages is None
    for message in (b"1", b"2", b"3"):
        listener._deliver(message)
    assert [listener.take() for _ in range(3)] == [b"1", b"2", b"3"]
    assert listener.messages is None


async def test_an_answer_that_finds_its_waiter_makes_no_queue() -> None:
    listener = picows_ws._Listener(1 << 20)
    listener.waiter = asyncio.get_running_loop().create_future()
    listener._deliver(b"answer")
    assert listener.waiter.result() == b"answer"
    assert listener.messages is None
    assert not hasattr(listener, "__dict__")


async def test_pongs_resolve_their_probe_and_a_lost_connection_fails_the_rest() -> None:
    loop = asyncio.get_running_loop()
    listener = picows_ws._Listener(1 << 20)
    assert listener.pongs is None  # made by the first probe
    listener._pong(b"stray")  # a pong nobody waits for
    answered, pending = loop.create_future(), loop.create_future()
    listener.pongs = {b"a": answered, b"b": pending}
    listener._pong(b"a")
    assert answered.result() is None
    listener.on_ws_disconnected(None)  # type: ignore[arg-type]
    with pytest.raises(ConnectionResetError):
        pending.result()
    assert listener.pongs is None and listener.gone
