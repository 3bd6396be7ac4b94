"""Holding requests while a service sleeps: the activator's policy, pure.

Where it fits: the activator's server (pdfleet.activator.server) asks `HoldQueue.arrive()`
whether a request goes to the router at once or waits; on every turn of its dispatcher it asks
`HoldQueue.step()` which held request goes next and which waited too long; and it hands back with
`HoldQueue.rehold()` a request the router turned away for want of a pair. What it exports for
the operator comes from here too: `HoldQueue.held` and `oldest()` (requests held: wake the
service), and `Activity` (idleness). The clock, the router's /readiness and the sockets stay in
server.py, so every rule here is a table test (tests/unit/activator/test_hold.py).

One request's way (readiness: the router's /readiness said 200, it has a prefill/decode pair):

    arrive --ready, nobody held or being released--> forwarded at once -------------------+
       \\--otherwise--> HELD --ready, its turn--> RELEASING --sent upstream--> forwarded --+
                        ^ |       (the oldest first, one at a time)                       |
                        | +--maxWait passed, not ready--> EXPIRED (503, Retry-After)      |
                        | +--client gone--> left                                          |
                        +--REHELD, in its place <--the router's 503, /readiness says no---+

While anything is held a new request queues behind it even when the router is ready, so a
request that came later never overtakes one that waited. Every request takes its place in the
arrival order when it arrives, held or not: a request the router turned away (its last pair
left between two readiness polls) goes back to that place, ahead of those that came after it,
and keeps its arrival time, so maxWait still counts from its arrival.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    FORWARD = "forward"
    HOLD = "hold"
    EXPIRE = "expire"


def verdict(*, ready: bool, waited_s: float, max_wait_s: float) -> Verdict:
    """What becomes of a held request that has waited `waited_s`. A ready router wins over a
    deadline reached in the same turn: the client is still there, and a pair to serve it."""
    if ready:
        return Verdict.FORWARD
    if waited_s >= max_wait_s:
        return Verdict.EXPIRE
    return Verdict.HOLD


@dataclass(frozen=True)
class Ticket:
    """One request: its place in the arrival order and its arrival (monotonic seconds). Every
    request has one, the ones forwarded at once too: the router may turn one away, and it then
    waits in the place it arrived in."""

    seq: int
    arrived_s: float


@dataclass(frozen=True)
class Step:
    """One turn of the dispatcher: the request to send on now, and those to answer 503."""

    release: Ticket | None = None
    expired: tuple[Ticket, ...] = ()


class HoldQueue:
    """Held requests in arrival order, and the one being released."""

    def __init__(self, max_wait_s: float) -> None:
        self.max_wait_s = max_wait_s
        # Insertion-ordered, and a client that leaves is taken out of the middle.
        self._held: dict[int, Ticket] = {}
        self._releasing: Ticket | None = None
        self._next_seq = 0

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def busy(self) -> bool:
        """Something held or on its way out: a new request must queue behind it."""
        return bool(self._held) or self._releasing is not None

    def arrive(self, *, ready: bool, now_s: float) -> tuple[Ticket, Verdict]:
        """The request's ticket, and FORWARD (at once) or HOLD (it is held under the ticket)."""
        ticket = Ticket(self._next_seq, now_s)
        self._next_seq += 1
        if ready and not self.busy:
            return ticket, Verdict.FORWARD
        self._held[ticket.seq] = ticket
        return ticket, Verdict.HOLD

    def rehold(self, ticket: Ticket) -> None:
        """The router turned the request away for want of a pair (its 503, and /readiness said
        no): hold it again, in the place its arrival gave it (ahead of later ones, behind
        earlier ones) and with its arrival time, so that maxWait counts from its arrival."""
        self.sent(ticket)
        self._held[ticket.seq] = ticket
        # Tickets are numbered in arrival order: sorted by number, the dict is in that order.
        self._held = dict(sorted(self._held.items()))

    def step(self, *, ready: bool, now_s: float) -> Step:
        """Release the oldest held request (one at a time: the next goes once `sent()` says
        this one reached the router), or expire those past max_wait while not ready."""
        if not ready:
            expired = tuple(
                t
                for t in self._held.values()
                if verdict(ready=False, waited_s=now_s - t.arrived_s, max_wait_s=self.max_wait_s)
                is Verdict.EXPIRE
            )
            for ticket in expired:
                del self._held[ticket.seq]
            return Step(expired=expired)
        if self._releasing is not None or not self._held:
            return Step()
        self._releasing = self._held.pop(next(iter(self._held)))
        return Step(release=self._releasing)

    def sent(self, ticket: Ticket) -> None:
        """The released request is on its way to the router: the next may go."""
        if self._releasing == ticket:
            self._releasing = None

    def leave(self, ticket: Ticket) -> None:
        """Its client went away, held or being released."""
        self._held.pop(ticket.seq, None)
        self.sent(ticket)

    def oldest(self) -> Ticket | None:
        """The held request that arrived first (None: nothing held; one being released is
        no longer held)."""
        return next(iter(self._held.values()), None)

    def next_deadline_s(self) -> float | None:
        """When the oldest held request reaches max_wait (None: nothing held)."""
        oldest = self.oldest()
        return None if oldest is None else oldest.arrived_s + self.max_wait_s


@dataclass
class Activity:
    """What the activator has in hand and when it last saw traffic, for idleness: a service is
    idle for `idle_for()` seconds. Times are Unix seconds (they are exported as timestamps)."""

    last_s: float
    """When a request last arrived or finished; the start of the process before any."""
    in_flight: int = 0
    """Requests received and not yet answered in full, the held ones included."""

    def arrived(self, now_s: float) -> None:
        self.in_flight += 1
        self.last_s = max(self.last_s, now_s)

    def finished(self, now_s: float) -> None:
        # A long stream ends idle time only when it ends: idleness counts from its last byte.
        self.in_flight -= 1
        self.last_s = max(self.last_s, now_s)

    def idle_for(self, now_s: float) -> float:
        """Seconds with nothing in flight; 0 while anything is."""
        return 0.0 if self.in_flight else max(0.0, now_s - self.last_s)
