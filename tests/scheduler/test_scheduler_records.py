"""Task records keep the fields most tasks never set apart (``RareFields``): a plain
queued task has none, and each field reads as its default until a task sets it."""

from __future__ import annotations

from apportion.core.demand import PLAIN
from apportion.scheduler.records import QUEUED, Restriction, TaskRecord
from apportion.testing import RecordingCluster


def test_a_plain_queued_task_holds_no_rare_fields(sim: RecordingCluster) -> None:
    sim.submit("inc-1")
    task = sim.state.tasks["inc-1"]
    assert task.state == QUEUED
    assert task._rare is None
    assert (task.choice, task.retries, task.restriction, task.replicas) == (0, 0, None, None)
    assert (task.error, task.reserved_on) == (None, None)
    assert (task.discard_result, task.cancelled, task.actor) == (False, False, False)


def test_writing_a_default_makes_no_rare_fields() -> None:
    task = TaskRecord("x", "f", b"", (), PLAIN, 0, 0, 1)
    task.choice = 0
    task.retries = 0
    task.replicas = None
    task.error = None
    task.reserved_on = None
    task.discard_result = False
    task.cancelled = False
    task.actor = False
    assert task._rare is None


def test_a_set_rare_field_reads_back_and_the_others_keep_their_defaults() -> None:
    task = TaskRecord("x", "f", b"", (), PLAIN, 0, 0, 1)
    task.reserved_on = "w1"
    assert task._rare is not None
    assert task.reserved_on == "w1" and task.error is None and not task.cancelled
    task.reserved_on = None  # back to the default: reads as it, whatever holds it
    assert task.reserved_on is None
    task.replicas = {"w2"}
    task.replicas.add("w3")  # the set itself is the task's, not a copy
    assert task.replicas == {"w2", "w3"}


def test_retries_and_restrictions_given_at_submission_are_kept() -> None:
    where = Restriction(frozenset({"w1"}), loose=False)
    task = TaskRecord("x", "f", b"", (), PLAIN, 0, 3, 1, where)
    assert task.retries == 3 and task.restriction is where
    task.retries -= 1
    assert task.retries == 2
    plain = TaskRecord("y", "f", b"", (), PLAIN, 0, 0, 2)
    assert plain.restriction is None and plain._rare is None
