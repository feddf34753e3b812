"""What must hold of every run in a journal, checked in tests after each change.

Apart from the journal (``journal.py``), which keeps it: O(journal), so never run
by the scheduler.
"""

from __future__ import annotations

from apportion.runs.journal import Journal
from apportion.runs.run_states import FINISHED, RUNNING, STAGED, STATES


def check_invariants(journal: Journal) -> None:
    """Raise ``AssertionError`` naming the first broken invariant; O(journal), for tests."""
    for run in journal.runs():
        where = f"run {run.id} ({run.state})"
        assert run.state in STATES, f"{where}: unknown state"
        assert (run.ended is not None) == (run.state in FINISHED), f"{where}: ended {run.ended}"
        assert (run.state == RUNNING) <= bool(run.worker), f"{where}: running on no worker"
        assert (run.state == RUNNING) <= (run.attempts >= 1), f"{where}: running, never started"
        assert (run.started is None) == (run.attempts == 0), f"{where}: started vs attempts"
        assert (run.state == STAGED) <= (run.attempts == 0), f"{where}: staged after starting"
        assert 0 <= run.preemptions <= run.attempts, f"{where}: more preempted than started"
        assert (run.array_id is None) == (run.array_index is None), f"{where}: array fields"
        assert run.array_index == run.spec.array_index, f"{where}: array index vs spec"
        assert run.name == run.spec.name and run.priority == run.spec.priority, where
        assert journal.history(run.id), f"{where}: no history"
