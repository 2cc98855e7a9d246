"""The Ray store's state (LeaseBook) on its own: order, leases, the total, refusals."""

from __future__ import annotations

from envlink._fleet.ray_store import LeaseBook


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_oldest_waiter_first_and_expired_waiters_skipped() -> None:
    """A freed slot goes to the oldest live waiter; one whose lease ran out drops out."""
    clock = _Clock()
    book = LeaseBook(clock)
    a, b, c = ("h:1:1", "s", 1, -1), ("h:2:1", "s", 1, -1), ("h:3:1", "s", 1, -1)
    for want in (a, b, c):
        book.join(want, lease=10.0)
    assert [ok for ok, _, _ in book.grant([a, b, c], 10.0, 60.0)] == [True, False, False]
    assert [ok for ok, _, _ in book.grant([c], 10.0, 60.0)] == [False]   # b is ahead
    clock.now += 5
    book.renew([("h:1:1", "s"), ("h:3:1", "s")], 10.0)                     # b stops renewing
    clock.now += 6
    book.release([("h:1:1", "s")])
    assert [ok for ok, _, _ in book.grant([c], 10.0, 60.0)] == [True]


def test_held_leases_expire_unless_renewed() -> None:
    """A holder that stops renewing loses its slot after the lease."""
    clock = _Clock()
    book = LeaseBook(clock)
    a, b = ("h:1:1", "s", 1, -1), ("h:2:1", "s", 1, -1)
    book.join(a, 2.0)
    assert book.grant([a], 2.0, 60.0)[0][0]
    book.join(b, 2.0)
    clock.now += 1.5
    book.renew([("h:2:1", "s")], 2.0)
    assert not book.grant([b], 2.0, 60.0)[0][0]
    clock.now += 1.0                                                       # a's lease ran out
    assert book.grant([b], 2.0, 60.0)[0] == (True, 1, 1)


def test_total_and_refusal() -> None:
    """The total spans scopes; a refusal lowers the scope's limit to what it held."""
    clock = _Clock()
    book = LeaseBook(clock)
    x, y = ("h:1:1", "session x", -1, 1), ("h:1:2", "session y", -1, 1)
    book.join(x, 10.0)
    book.join(y, 10.0)
    assert [ok for ok, _, _ in book.grant([x, y], 10.0, 60.0)] == [True, False]
    assert book.refused("session x", -1, 60.0) == 1
    (row,) = [r for r in book.status(60.0) if r["scope"] == "session x"]
    assert (row["holders"], row["limit"]) == (1, 1)
