"""Whose turn it is on a GPU that two models take turns on: decisions and the lease, no models.

``OnDemandEngine`` (``on_demand.py``) holds a ``GpuLease`` while its model is on the card.
Each model's scheduler says what waits for it (``Demand``); ``next_turn`` and ``must_yield``
decide from that alone, so the order is unit-tested with fake demands and a fake clock:
a client goes before background work (anchors), the longest-waiting client's model goes
next (a request waits for at most one swap), and background work gets the card only from a
holder idle for ``BACKGROUND_AFTER_IDLE_S``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds the model on the card must have had nothing to do before it gives the card to
#: another model's background work (anchors), so that a client's next request, seconds after
#: its last, does not find the card gone.
BACKGROUND_AFTER_IDLE_S = 3.0
#: How often a model waiting for its turn looks again, in seconds (it is also woken at once
#: by every release).
_WAKE_S = 0.05


@dataclass(frozen=True)
class Demand:
    """What waits for one model (``scheduler.Scheduler.demand``).

    Attributes:
        clients: queued segments of client requests.
        background: queued segments of background work (anchor rendering).
        since: ``time.monotonic()`` at which the oldest queued client segment was queued
            (None without one): the client that waits longest goes first.
    """

    clients: int = 0
    background: int = 0
    since: float | None = None


def next_turn(demands: dict[str, Demand], home: str | None) -> str | None:
    """Who gets the card once it is free: the model whose client waits longest; else one
    with background work (by name, so the choice is stable); else ``home``; None: nobody.

    Args:
        demands: per model name, what waits for it.
        home: the model that comes back when nothing waits (None: none does).
    """
    clients = [(d.since if d.since is not None else 0.0, who) for who, d in demands.items() if d.clients]
    if clients:
        return min(clients)[1]
    background = sorted(who for who, d in demands.items() if d.background)
    if background:
        return background[0]
    return home


def must_yield(holder: str, demands: dict[str, Demand], busy: bool, idle_s: float = float("inf")) -> bool:
    """Whether the model holding the card takes no new work and leaves once what it runs
    ended: a client waits for another model and waited longer than every client queued for
    the holder (so the clients of both are served in the order they came, each waiting for at
    most one swap), or only background work waits for another model while the holder has had
    nothing at all to do for ``BACKGROUND_AFTER_IDLE_S``.

    Args:
        busy: the holder has segments running.
        idle_s: seconds since the holder's last segment ended (or it came in).
    """
    mine = demands.get(holder, Demand())
    others = [d for who, d in demands.items() if who != holder]
    mine_since = mine.since if mine.clients and mine.since is not None else float("inf")
    if any(d.clients and (d.since if d.since is not None else 0.0) < mine_since for d in others):
        return True
    idle = not busy and not (mine.clients or mine.background) and idle_s >= BACKGROUND_AFTER_IDLE_S
    return idle and any(d.background for d in others)


class GpuLease:
    """One model on the GPU at a time, for models that do not fit there together; the
    models' turns follow ``next_turn`` and ``must_yield`` (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder: str | None = None
        self._demand: dict[str, Callable[[], Demand]] = {}
        self._home: str | None = None

    @property
    def holder(self) -> str | None:
        """The model on the card now (or loading), or None."""
        return self._holder

    def register(self, who: str, demand: Callable[[], Demand], home: bool = False) -> None:
        """Tell the lease what waits for ``who`` (its scheduler's ``demand``)."""
        with self._cond:
            self._demand[who] = demand
            if home:
                self._home = who
            self._cond.notify_all()

    def unregister(self, who: str) -> None:
        """``who`` never takes a turn again (it cannot be on this card): nothing that waits for
        it makes the holder leave."""
        with self._cond:
            self._demand.pop(who, None)
            if self._home == who:
                self._home = None
            self._cond.notify_all()

    def _demands(self) -> dict[str, Demand]:
        return {who: demand() for who, demand in self._demand.items()}

    def _turn(self) -> str | None:
        return next_turn(self._demands(), self._home)

    def try_acquire(self, who: str) -> bool:
        """Take the lease if it is free (or already ``who``'s) and no other model's turn
        comes first; never blocks."""
        with self._cond:
            if self._holder == who:
                return True
            if self._holder is None and self._turn() in (None, who):
                self._holder = who
                return True
            return False

    def wait_turn(self, who: str, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Block until it is ``who``'s turn (``next_turn``) and take the lease; False if
        ``give_up()`` turned true first."""
        with self._cond:
            while not (self._holder == who or (self._holder is None and self._turn() == who)):
                if give_up():
                    return False
                self._cond.wait(_WAKE_S)
            self._holder = who
            return True

    def release(self, who: str) -> None:
        """Let the lease go (no-op unless ``who`` holds it)."""
        with self._cond:
            if self._holder == who:
                self._holder = None
                self._cond.notify_all()

    def must_yield(self, who: str, busy: bool, idle_s: float = float("inf")) -> bool:
        """True when ``who`` (the holder) should take no new work and leave (``must_yield``)."""
        with self._cond:
            return must_yield(who, self._demands(), busy, idle_s)

    def demand(self, who: str) -> Demand:
        """What waits for ``who`` now."""
        with self._cond:
            demand = self._demand.get(who)
        return demand() if demand is not None else Demand()

    @property
    def home(self) -> str | None:
        """The model that comes back when nothing waits."""
        return self._home
