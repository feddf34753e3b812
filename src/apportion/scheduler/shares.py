"""Shares: who is owed what of the cluster, by weighted dominant resource fairness.

Work belongs to a *share*: an identifier with a weight (1 unless set) and an
optional quota (an amount per resource, a hard cap). Today each client is its own
share (``ClientRecord.share``, its id), so two notebooks are served alternately
rather than one after the other; the job queue's runs all belong to its service
client's share. A registry of people sets a client's share to its person's, and the
person's weight and quota here (``ShareBook.set``); nothing else changes.

Theory of operation
-------------------
A task's share is in its queue key (``records.Shared``), so each share's tasks of a
kind queue apart and a task carries its share at no cost. When tasks of more than
one share wait, or a waiting share has a quota, the placement pass builds a
``FairPass``: what each share holds now (the resources of its running tasks and
actors, and the threads its tasks take), against the cluster's totals. Each share's
*dominant share* is the largest fraction it holds of any resource, threads
included, divided by its weight (Ghodsi et al., "Dominant Resource Fairness", 2011).
The pass serves the share with the lowest first, one task at a time, updating its
holdings as it goes; within a share, today's order holds (priority, then age,
backfill, reservations). A share with nothing waiting is not considered at all, so
what it leaves idle goes to the others (work-conserving).

A reservation (placement rule 3) keeps a worker's freed amounts for its task
against that task's own share's younger work, and against every share that is not
strictly further below its fair share than the holder's; a share further below may
use them and take the reservation over. So a share that holds nothing keeps its
reservation against everyone, and a large request of any share starts once the
others' work there finishes: fairness across shares, no starvation within one.
A share's holdings only grow during a pass, so one that kept another's task out may,
having taken more, no longer be the needier: when a reservation kept a task out
(``FairPass.kept_out``) and tasks started since, the pass runs again, so that the
rule holds of the holdings the pass ends with.

A quota is never exceeded: a task whose share would hold more than its quota of a
resource does not start, even on an idle cluster, and reserves nothing (``why``
names the quota). Any resource may be capped, threads too: ``threads=4`` lets at
most four of the share's tasks run (or wait on a worker's queue) at once. A task
that secedes gives its resources back (rule 8), and with them its share's hold on
them: on rejoining it takes them back, even past its share's quota.

Pure: no clock, no I/O. With one share waiting and no quota, placement never
builds a ``FairPass``, so one user's throughput pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from apportion.core.resources import SCALE, Amounts, describe_resources
from apportion.scheduler.records import NO_SHARE, TaskRecord, WorkerRecord, share_of

#: The name threads go by in a share's holdings (a pool may not be called this).
THREADS = "threads"


class ShareBook:
    """The weight and quota of every share that has them (sparse: most have neither)."""

    __slots__ = ("quotas", "weights")

    def __init__(self) -> None:
        self.weights: dict[str, float] = {}
        self.quotas: dict[str, Amounts] = {}

    def set(self, share: str, weight: float = 1.0, quota: Mapping[str, int] | None = None) -> None:
        """Give ``share`` its weight and quota (in ticks per resource; None: no quota)."""
        if not weight > 0 or weight != weight or weight == float("inf"):
            raise ValueError(f"share {share!r}: weight must be a positive number, not {weight!r}")
        if quota is not None and any(amount < 0 for amount in quota.values()):
            raise ValueError(f"share {share!r}: a quota cannot be negative")
        if weight == 1.0:
            self.weights.pop(share, None)
        else:
            self.weights[share] = weight
        if quota is None:
            self.quotas.pop(share, None)
        else:
            self.quotas[share] = dict(quota)

    def weight(self, share: str) -> float:
        return self.weights.get(share, 1.0)

    def quota(self, share: str) -> Amounts | None:
        return self.quotas.get(share)


def holdings(
    workers: Mapping[str, WorkerRecord], tasks: Mapping[str, TaskRecord]
) -> dict[str, dict[str, int]]:
    """What each share holds now: the amounts of its running tasks (seceded ones that
    gave theirs back excepted) and actors, in ticks, and ``THREADS``, its tasks that
    count on a thread (those queued on a worker behind others included: they will)."""
    held: dict[str, dict[str, int]] = {}
    for worker in workers.values():
        seceded = worker.seceded
        for key in worker.processing:
            task = tasks.get(key)
            if task is None:
                continue
            if seceded.get(key):
                continue  # gave its resources back, and its thread: its share holds none
            mine = held.setdefault(share_of(task.queue), {})
            if key not in seceded:
                mine[THREADS] = mine.get(THREADS, 0) + 1
            _add(mine, task.resources)
        for key in worker.actors:
            task = tasks.get(key)
            if task is not None:
                _add(held.setdefault(share_of(task.queue), {}), task.resources)
    return held


def _add(into: dict[str, int], amounts: Amounts) -> None:
    for name, amount in amounts.items():
        into[name] = into.get(name, 0) + amount


def over_quota(quota: Amounts, held: Mapping[str, int], amounts: Amounts) -> str | None:
    """The first resource a task asking for ``amounts`` would take past ``quota``;
    None if none. Every task takes a thread too, so a quota of ``THREADS`` caps how
    many of the share's tasks run at once, plain ones included."""
    for name, cap in quota.items():
        need = SCALE if name == THREADS else amounts.get(name, 0)
        if need and held_ticks(held, name) + need > cap:
            return name
    return None


def quota_holds_back(
    quota: Amounts, held: Mapping[str, int], alternatives: Sequence[Amounts]
) -> str | None:
    """The capped resource of the first alternative when every alternative of a
    demand would take its share past ``quota`` (the quota alone holds the task
    back); None when one fits under it."""
    first: str | None = None
    for amounts in alternatives:
        name = over_quota(quota, held, amounts)
        if name is None:
            return None
        first = first or name
    return first


def held_ticks(held: Mapping[str, int], name: str) -> int:
    """What ``held`` (a share's ``holdings``) has of ``name`` in ticks, as a quota
    counts it: threads are held as a count, capped as an amount (``threads=4``)."""
    amount = held.get(name, 0)
    return amount * SCALE if name == THREADS else amount


class FairPass:
    """Each share's holdings during one placement pass, kept up to date as it assigns."""

    __slots__ = ("book", "held", "kept_out", "released", "taken", "totals")

    def __init__(
        self,
        book: ShareBook,
        workers: Mapping[str, WorkerRecord],
        tasks: Mapping[str, TaskRecord],
    ) -> None:
        self.book = book
        totals: dict[str, int] = {THREADS: 0}
        for worker in workers.values():
            totals[THREADS] += worker.nthreads
            _add(totals, worker.ledger.total)
        #: The cluster's supply of each resource (the denominators of the shares).
        self.totals = totals
        self.held = holdings(workers, tasks)
        #: Tasks assigned in the pass so far (``took``).
        self.taken = 0
        #: A reservation of one share kept another's task out, as it was not further
        #: below its fair share: the placement pass tries again once shares took more.
        self.kept_out = False
        #: A reservation was given up in the pass, its task held by its share's quota:
        #: a task tried before, kept out by it, may start now. The pass runs again.
        self.released = False

    def dominant(self, share: str) -> float:
        """The largest fraction of any resource ``share`` holds, over its weight."""
        held = self.held.get(share)
        if not held:
            return 0.0
        totals = self.totals
        most = max((amount / totals[n] for n, amount in held.items() if totals.get(n)), default=0.0)
        return most / self.book.weight(share)

    def needier(self, share: str, than: str) -> bool:
        """``share`` is strictly further below its fair share than ``than``."""
        return share != than and self.dominant(share) < self.dominant(than)

    def took(self, task: TaskRecord) -> None:
        """``task`` was assigned: its share holds its resources and a thread more."""
        self.taken += 1
        mine = self.held.setdefault(share_of(task.queue), {})
        mine[THREADS] = mine.get(THREADS, 0) + 1
        _add(mine, task.resources)

    def over_quota(self, share: str, amounts: Amounts) -> str | None:
        """The resource of ``share``'s quota that ``amounts`` more would exceed, if any."""
        quota = self.book.quotas.get(share) if share != NO_SHARE else None
        if quota is None:
            return None
        return over_quota(quota, self.held.get(share, {}), amounts)


def quota_note(
    book: ShareBook,
    workers: Mapping[str, WorkerRecord],
    tasks: Mapping[str, TaskRecord],
    task: TaskRecord,
) -> str | None:
    """For ``why``: the quota that holds ``task`` back now, in words; None if none.

    Held back means every alternative of its demand would take its share past its
    quota of some resource."""
    share = share_of(task.queue)
    quota = book.quotas.get(share)
    if quota is None:
        return None
    held = holdings(workers, tasks).get(share, {})
    name = quota_holds_back(quota, held, task.demand.alternatives)
    if name is None:
        return None
    asks = SCALE if name == THREADS else task.demand.alternatives[0].get(name, 0)
    return (
        f"queued: its share {share!r} is at its quota of {name}: it holds "
        f"{describe_resources({name: held_ticks(held, name)})} of "
        f"{describe_resources({name: quota[name]})}, and this task asks for "
        f"{describe_resources({name: asks})} more"
    )
