"""Each share's figures as plain data: what it holds, its fair share, its quota and
its waiting work, for the status (``apportion status``, the dashboard, /metrics).

Read-only over the scheduler's records, as ``status.py`` is. The holdings are the
fair pass's own (``shares.FairPass``: the resources of each share's running tasks
and actors, and the threads its tasks take, against the cluster's totals), so what
is shown is what placement weighs. The waiting work is read from the counts of
QUEUED tasks by kind of request that ``telemetry`` keeps, so this costs a walk over
the running tasks and the kinds, nothing per queued task.

The figures of a share, each defined once here (docs/scheduling.md says the same):

- ``held``: what it holds now, per resource, ``threads`` included (its tasks that
  take a thread, running or queued on a worker behind others).
- ``dominant``: the largest fraction of the cluster's supply of any one resource
  that it holds, and which resource that is (Ghodsi et al.'s *dominant share*).
- ``fair``: its weight over the sum of the weights of the *active* shares (those
  holding or waiting for something), itself counted even when it is idle. While a
  share has work waiting that fits, the fair pass serves it before any share whose
  dominant share, over its weight, is larger; so a share with work waiting is
  brought up to at least ``fair`` of its dominant resource, unless its quota stops
  it first, and may go above it where the others leave resources idle.
- ``quota``: its hard caps (a person's), or None.
- ``waiting``: its QUEUED tasks (ready, waiting for resources or a thread), with
  what they ask for, by kind of request.
- ``quota_holds``: those of its waiting tasks that its quota alone keeps from
  starting (every alternative of their request would take the share past its quota
  of a resource), and the caps that do it; None when none are held so.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from typing import Any

from apportion.core.resources import SCALE, describe_resources
from apportion.scheduler.records import NO_SHARE, demand_of, restriction_of, share_of
from apportion.scheduler.shares import THREADS, FairPass, quota_holds_back
from apportion.scheduler.state import SchedulerState

#: Shares listed at most (people first, then the others by how much they hold):
#: a cluster with thousands of clients still has a bounded status and /metrics.
MAX_SHARES = 100

#: What a share stands for: an admitted person, a client of the owner (each is a
#: share of its own), a service such as the job queue, or neither any more (a client
#: that left, a person removed) while its running work finishes.
PERSON, CLIENT, SERVICE, OTHER = "person", "client", "service", "other"
#: Characters of a client's name kept (it chose the name itself).
MAX_NAME = 64


def share_rows(state: SchedulerState) -> list[dict[str, Any]]:
    """Every share that holds or waits for something, and every admitted person
    (idle or not): the figures of the module docstring, one dict each, with
    ``share`` (a person's name, or the scheduler's id of a client: unique),
    ``name`` (a person's, or the name the client gave: ``client-1a2b3c4d``, which
    two clients may share), ``kind`` and ``weight``. People first, by name; then the
    others, those holding most first."""
    fair = FairPass(state.shares, state.workers, state.tasks)
    waiting: dict[str, list[tuple[str, int, Any]]] = {}
    for key, count in state.telemetry.queued_kinds.items():
        if count:
            waiting.setdefault(share_of(key), []).append((_request(key), count, key))
    names = set(fair.held) | set(waiting) | set(state.people)
    names.discard(NO_SHARE)
    active_weight = sum(
        state.shares.weight(name) for name in names if fair.held.get(name) or name in waiting
    )
    rows = [_row(state, fair, name, waiting.get(name, []), active_weight) for name in names]
    rows.sort(key=lambda row: (row["kind"] != PERSON, -row["dominant"]["fraction"], row["share"]))
    return rows[:MAX_SHARES]


def _row(
    state: SchedulerState,
    fair: FairPass,
    name: str,
    waiting: list[tuple[str, int, Any]],
    active_weight: float,
) -> dict[str, Any]:
    weight = state.shares.weight(name)
    held = fair.held.get(name, {})
    active = bool(held) or bool(waiting)
    quota = state.shares.quota(name)
    resource, fraction = _dominant(held, fair.totals)
    client = state.clients.get(name)
    return {
        "share": name,
        "name": name if client is None else _printable(client.name),
        "kind": _kind(state, name),
        "weight": weight,
        "held": {n: (a if n == THREADS else a / SCALE) for n, a in sorted(held.items()) if a},
        "dominant": {"resource": resource, "fraction": fraction},
        "fair": weight / (active_weight if active else active_weight + weight),
        "quota": None if quota is None else {n: a / SCALE for n, a in sorted(quota.items())},
        "waiting": {
            "count": sum(count for _, count, _ in waiting),
            "requests": [
                {"request": text, "count": count}
                for text, count, _ in sorted(waiting, key=_by_text)
            ],
        },
        "quota_holds": None if quota is None else _quota_holds(quota, held, waiting),
    }


def _printable(name: str) -> str:
    """A client's name as it may be shown: its own choice, so cut, and without control
    characters (a terminal would act on them)."""
    return "".join(ch if ch.isprintable() else "?" for ch in name[:MAX_NAME])


def _kind(state: SchedulerState, name: str) -> str:
    if name in state.people:
        return PERSON
    client = state.clients.get(name)
    if client is None:
        return OTHER
    return SERVICE if client.durable else CLIENT


def _dominant(held: dict[str, int], totals: dict[str, int]) -> tuple[str | None, float]:
    """The resource ``held`` has the largest fraction of, and that fraction."""
    best: tuple[str | None, float] = (None, 0.0)
    for name, amount in sorted(held.items()):
        total = totals.get(name)
        if total and amount / total > best[1]:
            best = (name, amount / total)
    return best


def _request(key: Any) -> str:
    """A kind of request in words: ``GPU=1``, ``a thread``, ``... on w1, w2``."""
    text = " or ".join(
        describe_resources(amounts) or "a thread" for amounts in demand_of(key).alternatives
    )
    restriction = restriction_of(key)
    return text if restriction is None else f"{text} on {restriction.describe()}"


def _quota_holds(
    quota: dict[str, int], held: dict[str, int], waiting: list[tuple[str, int, Any]]
) -> dict[str, Any] | None:
    """The waiting tasks the quota alone holds back, and the caps that hold them."""
    count = 0
    caps: dict[str, float] = {}
    for _, n, key in waiting:
        first = quota_holds_back(quota, held, demand_of(key).alternatives)
        if first is not None:
            count += n
            caps[first] = quota[first] / SCALE
    return {"count": count, "resources": dict(sorted(caps.items()))} if count else None


def _by_text(entry: tuple[str, int, Any]) -> tuple[str, int]:
    return entry[0], -entry[1]
