"""Bounds on connections that have not finished their handshake, and on the log lines
their refusals cost.

Theory of operation. A listener admits every connection it accepts into a
``HandshakeGate`` and calls ``done`` once the handshake finished or failed. Until then
a connection costs a socket and a task while proving nothing, so the gate bounds how
many wait: ``per_address`` for one host, ``total`` in all. When a new connection would
break a bound, the gate names the *oldest* pending connections to drop, never the new
one. A legitimate handshake takes milliseconds, so the connections that have been
pending longest are the ones least likely to be legitimate; dropping the new one
instead would let a peer trickling bytes from one address lock out every user sharing
that address (all users of a login node share 127.0.0.1), and a host over the whole
``total`` lock out every other host.

A peer refused again and again (a port scanner, a worker of another version in a
retry loop) must not flood the log: ``RefusalLog`` says the first refusal from a host,
keeps quiet for a window, then sums up what it kept quiet about.

Pure: the caller passes the time in (from a monotonic clock); nothing here does I/O
or reads a clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

#: Seconds one host's refusals are kept quiet after a line about them.
REFUSAL_WINDOW = 60.0
#: Hosts ``RefusalLog`` remembers; past it the host whose window started first is
#: forgotten (with its count), so that refusals from many addresses cost no memory.
MAX_REFUSAL_HOSTS = 4096


@dataclass(slots=True)
class _Pending:
    host: str
    since: float


class HandshakeGate:
    """The connections still in their handshake, at most ``per_address`` per host and
    ``total`` in all."""

    def __init__(self, per_address: int = 64, total: int = 1024) -> None:
        if per_address < 1 or total < 1:
            raise ValueError(f"a gate needs room for one connection: {per_address=}, {total=}")
        self.per_address = per_address
        self.total = total
        #: Every pending connection, oldest first. Invariant: at most ``total``.
        self._pending: OrderedDict[Hashable, _Pending] = OrderedDict()
        #: host -> its pending connections, oldest first; no host without any.
        #: Invariant: at most ``per_address`` each; together, the keys of ``_pending``.
        self._by_host: dict[str, OrderedDict[Hashable, None]] = {}
        #: How refusals are logged (``refused``).
        self.refusals = RefusalLog()

    def admit(self, key: Hashable, host: str, now: float) -> list[Hashable]:
        """Record ``key``, a new connection from ``host`` still to shake hands; return
        the pending connections to drop so that the bounds hold: the host's oldest if
        it has ``per_address`` pending, else the oldest of all if ``total`` are
        pending (dropping the host's oldest makes room in the total too, so one at
        most). The caller closes them; they are no longer pending here."""
        if key in self._pending:
            raise ValueError(f"{key!r} is already pending")
        evicted: list[Hashable] = []
        mine = self._by_host.get(host)
        if mine is not None and len(mine) >= self.per_address:
            evicted.append(self._drop(next(iter(mine))))
        if len(self._pending) >= self.total:
            evicted.append(self._drop(next(iter(self._pending))))
        self._pending[key] = _Pending(host, now)
        self._by_host.setdefault(host, OrderedDict())[key] = None
        return evicted

    def done(self, key: Hashable) -> None:
        """``key``'s handshake finished or failed (or it was dropped): no longer pending.
        Unknown keys are ignored, so every path out of a handshake may call it."""
        pending = self._pending.pop(key, None)
        if pending is None:
            return
        mine = self._by_host[pending.host]
        del mine[key]
        if not mine:
            del self._by_host[pending.host]

    def _drop(self, key: Hashable) -> Hashable:
        self.done(key)
        return key

    def pending(self, host: str | None = None) -> int:
        """Connections pending, from ``host`` or in all."""
        if host is None:
            return len(self._pending)
        return len(self._by_host.get(host, ()))

    def since(self, key: Hashable) -> float | None:
        """When ``key`` was admitted; None if it is not pending."""
        pending = self._pending.get(key)
        return None if pending is None else pending.since

    def refused(self, host: str, reason: str, now: float) -> str | None:
        """A line to log for refusing a connection from ``host``, or None to keep quiet
        (``RefusalLog.refused``)."""
        return self.refusals.refused(host, reason, now)

    def refusal_lines(self, host: str, reason: str, now: float) -> list[str]:
        """Every line to log on refusing a connection from ``host``: the summaries of
        windows that passed, then this refusal's line if it gets one."""
        lines = self.refusals.overdue(now)
        line = self.refused(host, reason, now)
        return [*lines, line] if line is not None else lines


def check_invariants(gate: HandshakeGate) -> None:
    """Raise ``AssertionError`` if ``gate``'s state breaks an invariant."""
    assert len(gate._pending) <= gate.total
    from_hosts: set[Hashable] = set()
    for host, keys in gate._by_host.items():
        assert 0 < len(keys) <= gate.per_address, (host, len(keys))
        assert all(gate._pending[key].host == host for key in keys)
        from_hosts.update(keys)
    assert from_hosts == set(gate._pending)
    check_refusals(gate.refusals)


@dataclass(slots=True)
class _Refusals:
    #: When the host's current window started (a line about it was returned then).
    since: float
    #: Refusals since then that no line has mentioned yet.
    unsaid: int
    reason: str


class RefusalLog:
    """When to log a refused connection: the first refusal from a host at once, further
    ones within ``window`` seconds not at all, then one line summing them up.

    ``now`` comes from a monotonic clock (``loop.time()``): windows are kept in the
    order they started.
    """

    def __init__(self, window: float = REFUSAL_WINDOW, max_hosts: int = MAX_REFUSAL_HOSTS) -> None:
        self.window = window
        self.max_hosts = max_hosts
        #: host -> its window, in the order the windows started (oldest first).
        #: Invariant: at most ``max_hosts``.
        self._hosts: OrderedDict[str, _Refusals] = OrderedDict()

    def refused(self, host: str, reason: str, now: float) -> str | None:
        """The line to log for refusing a connection from ``host`` for ``reason``: one
        for the first refusal, None for others within the window, then a summary of
        them all (this one included) at the first refusal after it."""
        known = self._hosts.get(host)
        if known is not None and now - known.since < self.window:
            known.unsaid += 1
            known.reason = reason
            return None
        if known is not None and known.unsaid:
            line = _summary(host, known.unsaid + 1, now - known.since, reason)
        else:
            line = f"refused a connection from {host}: {reason}"
        self._hosts.pop(host, None)
        self._hosts[host] = _Refusals(now, 0, reason)
        if len(self._hosts) > self.max_hosts:
            self._hosts.popitem(last=False)
        return line

    def overdue(self, now: float) -> list[str]:
        """Summaries of the refusals kept quiet in windows that have passed, for a
        periodic caller (else refusals that stop within a window are never said);
        hosts whose window passed are forgotten."""
        lines = []
        while self._hosts:
            host, known = next(iter(self._hosts.items()))
            if now - known.since < self.window:
                break  # windows start in order: the later ones have not passed either
            del self._hosts[host]
            if known.unsaid:
                lines.append(_summary(host, known.unsaid, now - known.since, known.reason))
        return lines


def _summary(host: str, count: int, seconds: float, reason: str) -> str:
    connections = "connection" if count == 1 else "connections"
    return f"refused {count} more {connections} from {host} in the last {seconds:.0f} s: {reason}"


def check_refusals(log: RefusalLog) -> None:
    """Raise ``AssertionError`` if ``log``'s state breaks an invariant."""
    assert len(log._hosts) <= log.max_hosts
    starts = [known.since for known in log._hosts.values()]
    assert starts == sorted(starts), "windows are kept in the order they started"
    assert all(known.unsaid >= 0 for known in log._hosts.values())
