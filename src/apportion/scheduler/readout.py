"""What views outside the scheduler (the dashboard) read of its state: the status and
one task's story, as plain data. Pure; called on the scheduler's loop.

The dashboard package is given a ``Readout`` rather than the state, so that it
depends on no module of the scheduler's, and the scheduler can start it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from apportion.scheduler.state import SchedulerState
from apportion.scheduler.status import STREAM_LIMIT, durations, status


class LagReading(Protocol):
    """How late an event loop wakes up (``apportion.loop_lag.LoopLag``)."""

    @property
    def last(self) -> float:
        """Seconds late at the last wake-up."""
        ...

    @property
    def peak(self) -> float:
        """The most over the recent wake-ups."""
        ...


@dataclass(frozen=True, slots=True)
class Readout:
    """Reads ``state`` for the dashboard (``dashboard.server.SchedulerReadout``)."""

    state: SchedulerState
    #: The scheduler's event-loop lag, for ``/metrics``; None: not measured (reads 0).
    lag: LagReading | None = None

    def status(self, stream_since: int, events_since: int) -> dict[str, Any]:
        """``status.status`` with the executions and warnings after the given numbers."""
        return status(
            self.state,
            stream_since=stream_since,
            events_since=events_since,
            stream_limit=STREAM_LIMIT,
        )

    def durations(self) -> dict[str, Any]:
        """``status.durations``: the task-duration histograms."""
        return durations(self.state)

    def loop_lag(self) -> tuple[float, float]:
        """Seconds the scheduler's loop woke up late: last, and the recent peak."""
        return (0.0, 0.0) if self.lag is None else (self.lag.last, self.lag.peak)

    def story(self, key: str) -> dict[str, Any] | None:
        """``{"key", "now", "story": [[time, key, from, to, cause], ...]}``; None for a
        key the scheduler neither holds nor has a story of."""
        rows = self.state.story(key)
        if not rows and key not in self.state.tasks:
            return None
        return {"key": key, "now": self.state.now, "story": [list(row) for row in rows]}
