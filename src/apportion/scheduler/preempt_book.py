"""What the scheduler keeps for preemption (``preemption.py``): which tasks may be
stopped, since when each share waits below its fair share, which stops are under way.

Sparse: a scheduler with no preemptible task keeps three empty containers.
"""

from __future__ import annotations

from typing import NamedTuple


class Preempting(NamedTuple):
    """A preemptible task being stopped: its worker was told (``InterruptTasks``) and
    has not reported it yet; its resources stay held until it does."""

    #: The worker it is stopped on.
    worker_id: str
    #: The share it makes room for (no second stop is made for that share meanwhile).
    for_share: str
    #: Why, in words (its history and the job queue's say so).
    reason: str


class PreemptBook:
    """Preemptible tasks, waiting shares, stops under way."""

    __slots__ = ("preemptible", "stopping", "waiting_since")

    def __init__(self) -> None:
        #: Keys of live tasks that may be stopped and run again: submitted with
        #: ``TaskSpec.preemptible`` by a service (the job queue). A key leaves with
        #: its task (``SchedulerState._delete``).
        self.preemptible: set[str] = set()
        #: Share -> since when (the scheduler's clock) it has had work waiting while
        #: below its fair share, without a break; shares not in that case are absent.
        self.waiting_since: dict[str, float] = {}
        #: Tasks being stopped (each one of ``preemptible``) -> who and why; an entry
        #: goes when the task's worker reports it (``settle``) or the task is
        #: forgotten, or, gone stale (its worker lost), at the next look
        #: (``preemption.check``).
        self.stopping: dict[str, Preempting] = {}

    def settle(self, key: str, worker_id: str) -> Preempting | None:
        """The worker ``worker_id`` reported ``key`` ended: the stop under way there, if any."""
        stop = self.stopping.get(key)
        if stop is None or stop.worker_id != worker_id:
            return None
        del self.stopping[key]
        return stop
