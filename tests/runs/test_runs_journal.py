"""The SQLite journal of runs: lifecycle, removal, durability, concurrency and the claim."""

from __future__ import annotations

import ast
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apportion.core.demand import Demand
from apportion.runs.journal import (
    CANCELLED,
    COMPLETED,
    FAILED,
    FINISHED,
    LOST,
    QUEUED,
    RUN_MOVES,
    RUNNING,
    SCHEMA_VERSION,
    STAGED,
    STATES,
    Journal,
    JournalBusy,
    JournalError,
    RunRecord,
    default_home,
    default_journal_path,
    describe_exit,
)
from apportion.runs.journal_invariants import check_invariants
from apportion.runs.spec import RunSpec, expand_array, new_spec

ENV = {"PATH": "/usr/bin", "HOME": "/home/u"}


def spec(*args: str, **kw: Any) -> RunSpec:
    kw.setdefault("cwd", "/work")
    kw.setdefault("env", ENV)
    return new_spec(list(args or ("echo", "hi")), **kw)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with Journal(tmp_path / "runs.db") as j:
        yield j
        check_invariants(j)


def started(journal: Journal, now: float = 2.0, **kw: Any) -> int:
    """A run that is running on w1."""
    [run_id] = journal.stage([spec(**kw)], 1.0, queued=True)
    journal.mark_running(run_id, "w1", "foo=1", now)
    return run_id


def run(journal: Journal, run_id: int) -> RunRecord:
    record = journal.get(run_id)
    assert record is not None
    return record


def texts(journal: Journal, run_id: int) -> list[str]:
    return [text for _, text in journal.history(run_id)]


# --- staging and reading ------------------------------------------------------------


def test_stage_and_get(journal: Journal) -> None:
    made = spec("train", "--lr", "0.1", resources="foo=1", name="lr", priority=3)
    [run_id] = journal.stage([made], 100.0)
    record = run(journal, run_id)
    assert record.spec == made
    assert (record.id, record.name, record.state, record.priority) == (run_id, "lr", STAGED, 3)
    assert (record.created, record.started, record.ended) == (100.0, None, None)
    assert (record.worker, record.held, record.attempts, record.reason) == ("", "", 0, "")
    assert (record.exit_code, record.signal, record.cancel_requested) == (None, None, False)
    assert (record.array_id, record.array_index, record.waiting) == (None, None, "")
    assert journal.history(run_id) == [(100.0, "staged")]
    assert journal.get(run_id + 1) is None


def test_runs_read_back_share_the_demand_of_their_text(journal: Journal) -> None:
    ids = journal.stage([spec(resources="gpu=1"), spec(resources="gpu=1")], 1.0)
    first, second = (run(journal, run_id).spec for run_id in ids)
    assert first.demand == Demand(({"gpu": 10_000},))
    assert first.demand is second.demand  # the text is parsed once, not once per run


def test_a_run_stored_with_its_resources_in_numbers_still_reads(journal: Journal) -> None:
    # Older versions stored the resources twice, as text and as numbers ("demand").
    [run_id] = journal.stage([spec(resources="foo=0.5")], 1.0)
    row = journal._db.execute("SELECT spec FROM runs WHERE id = ?", (run_id,)).fetchone()
    old = json.loads(row[0]) | {"demand": {"foo": 0.5}}
    journal._db.execute("UPDATE runs SET spec = ? WHERE id = ?", (json.dumps(old), run_id))
    assert "demand" not in json.loads(row[0])
    assert run(journal, run_id).spec == spec(resources="foo=0.5")


def test_stage_queued(journal: Journal) -> None:
    ids = journal.stage([spec(), spec()], 5.0, queued=True)
    assert [r.state for r in journal.runs(ids=ids)] == [QUEUED, QUEUED]
    assert texts(journal, ids[0]) == ["submitted"]
    assert journal.stage([], 5.0) == []


def test_an_array_shares_the_id_of_its_first_run(journal: Journal) -> None:
    journal.stage([spec()], 1.0)
    ids = journal.stage(expand_array(spec("x", "{}", name="sweep"), [5, 6, 7]), 1.0)
    records = journal.runs(ids=ids)
    assert [(r.array_id, r.array_index) for r in records] == [(ids[0], i) for i in (5, 6, 7)]
    assert [r.label() for r in records] == ["sweep[5]", "sweep[6]", "sweep[7]"]
    assert records[1].spec.command == ("x", "6")


def test_labels(journal: Journal) -> None:
    a, b = journal.stage([spec(), spec(name="named")], 1.0)
    assert (run(journal, a).label(), run(journal, b).label()) == (str(a), "named")


def test_ids_are_never_reused(journal: Journal) -> None:
    first = journal.stage([spec(), spec()], 1.0)
    journal.remove(first)
    assert journal.stage([spec()], 1.0)[0] > max(first)


def test_runs_filter_by_state_and_id_in_id_order(journal: Journal) -> None:
    ids = journal.stage([spec() for _ in range(5)], 1.0)
    journal.mark_queued(ids[3:], 2.0)
    assert [r.id for r in journal.runs()] == ids
    assert [r.id for r in journal.runs(states=[QUEUED])] == ids[3:]
    assert [r.id for r in journal.runs(ids={ids[4], ids[0]})] == [ids[0], ids[4]]
    assert [r.id for r in journal.runs(states={STAGED}, ids=ids[2:4])] == [ids[2]]
    assert journal.runs(states=[]) == []


def test_counts_name_every_state(journal: Journal) -> None:
    assert journal.counts() == dict.fromkeys(STATES, 0)
    ids = journal.stage([spec() for _ in range(4)], 1.0)
    journal.mark_queued(ids[:1], 2.0)
    assert journal.counts() == dict.fromkeys(STATES, 0) | {STAGED: 3, QUEUED: 1}
    assert journal.counts(ids[:2]) == dict.fromkeys(STATES, 0) | {STAGED: 1, QUEUED: 1}


def test_arrays_count_their_runs_by_state_newest_first(journal: Journal) -> None:
    journal.stage([spec()], 1.0)  # in no array
    first = journal.stage(expand_array(spec(name="sweep"), range(3)), 1.0)
    second = journal.stage(expand_array(spec(), range(2)), 1.0)
    journal.mark_queued(first[:1], 2.0)
    for run_id in second:
        journal.request_cancel(run_id, 3.0)
    zero = dict.fromkeys(STATES, 0)
    assert journal.arrays(10) == [
        (second[0], "", zero | {CANCELLED: 2}),
        (first[0], "sweep", zero | {STAGED: 2, QUEUED: 1}),
    ]
    assert journal.arrays(1) == [(second[0], "", zero | {CANCELLED: 2})]


def test_identical_environments_are_stored_once(journal: Journal) -> None:
    ids = journal.stage([spec(), spec(), spec(env={"OTHER": "1"})], 1.0)
    ids += journal.stage(expand_array(spec(), range(100)), 1.0)
    assert environment_rows(journal) == 2
    assert run(journal, ids[1]).spec.env == ENV
    assert run(journal, ids[2]).spec.env == {"OTHER": "1"}
    journal.remove(ids[2:3])
    assert environment_rows(journal) == 1
    journal.remove([ids[0]])
    assert environment_rows(journal) == 1
    journal.remove(ids[1:2] + ids[3:])
    assert environment_rows(journal) == 0


def environment_rows(journal: Journal) -> int:
    with sqlite3.connect(journal.path) as db:
        return int(db.execute("SELECT COUNT(*) FROM environments").fetchone()[0])


# --- lifecycle ----------------------------------------------------------------------


def test_a_run_from_staged_to_completed(journal: Journal) -> None:
    [run_id] = journal.stage([spec()], 1.0)
    journal.set_waiting(run_id, "no worker has foo free")
    journal.mark_queued([run_id], 2.0)
    journal.mark_running(run_id, "w1", "gpu=[0] foo=1", 3.0)
    record = run(journal, run_id)
    assert (record.state, record.worker, record.held) == (RUNNING, "w1", "gpu=[0] foo=1")
    assert (record.started, record.attempts, record.waiting) == (3.0, 1, "")
    journal.mark_ended(run_id, COMPLETED, 4.0, exit_code=0)
    record = run(journal, run_id)
    assert (record.state, record.ended, record.exit_code, record.worker) == (
        COMPLETED,
        4.0,
        0,
        "w1",
    )
    assert journal.history(run_id) == [
        (1.0, "staged"),
        (2.0, "queued"),
        (3.0, "started on w1 holding gpu=[0] foo=1"),
        (4.0, "completed (exit 0)"),
    ]


def test_failure_records_exit_signal_and_reason(journal: Journal) -> None:
    run_id = started(journal)
    journal.mark_ended(
        run_id, FAILED, 9.0, signal=signal.SIGKILL, reason="timed out after 10m\nkilled"
    )
    record = run(journal, run_id)
    assert (record.exit_code, record.signal) == (None, signal.SIGKILL)
    assert record.reason == "timed out after 10m killed"
    assert texts(journal, run_id)[-1] == "failed (SIGKILL): timed out after 10m killed"


def test_requeue_after_an_interruption_then_start_again(journal: Journal) -> None:
    run_id = started(journal)
    journal.requeue(run_id, "worker w1 was lost", 3.0)
    record = run(journal, run_id)
    assert (record.state, record.worker, record.held) == (QUEUED, "", "")
    assert (record.reason, record.attempts) == ("worker w1 was lost", 1)
    journal.mark_running(run_id, "w2", "", 4.0)
    assert (run(journal, run_id).attempts, run(journal, run_id).started) == (2, 4.0)
    assert texts(journal, run_id)[-2:] == [
        "interrupted: worker w1 was lost; queued again",
        "started on w2 (attempt 2)",
    ]


def test_a_preempted_run_is_queued_again_and_counted_apart(journal: Journal) -> None:
    [run_id] = journal.stage([spec(preemptible=True)], 1.0, queued=True)
    journal.mark_running(run_id, "w1", "gpu=[0]", 2.0)
    journal.requeue(run_id, "preempted for share 'bob'", 3.0, preempted=True)
    record = run(journal, run_id)
    assert (record.state, record.attempts, record.preemptions) == (QUEUED, 1, 1)
    assert record.spec.preemptible
    journal.mark_running(run_id, "w1", "gpu=[0]", 4.0)
    assert texts(journal, run_id)[-2:] == [
        "preempted for share 'bob'; queued again",
        "started on w1 holding gpu=[0] (attempt 2)",
    ]
    journal.requeue(run_id, "its worker w1 left", 5.0)  # not a preemption
    assert run(journal, run_id).preemptions == 1
    journal.mark_running(run_id, "w2", "", 6.0)
    journal.requeue(run_id, "stopped for bob", 7.0, preempted=True)
    assert texts(journal, run_id)[-1] == "preempted: stopped for bob; queued again"


def test_a_journal_of_schema_version_1_is_brought_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with Journal(path) as journal:
        [run_id] = journal.stage([spec()], 1.0, queued=True)
    with sqlite3.connect(path) as db:  # as the version before preemption wrote it
        db.execute("ALTER TABLE runs DROP COLUMN preemptions")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    db.close()
    with Journal(path) as journal:
        record = run(journal, run_id)
        assert (record.state, record.preemptions, record.spec.preemptible) == (QUEUED, 0, False)
        journal.mark_running(run_id, "w1", "", 2.0)
        journal.requeue(run_id, "preempted", 3.0, preempted=True)
        assert run(journal, run_id).preemptions == 1
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    db.close()
    assert version == (str(SCHEMA_VERSION),)


def test_a_queued_run_may_fail_without_starting(journal: Journal) -> None:
    [run_id] = journal.stage([spec()], 1.0, queued=True)
    journal.mark_ended(run_id, FAILED, 2.0, reason="no worker offers gpu")
    assert run(journal, run_id).attempts == 0


@pytest.mark.parametrize(
    ("state", "action"),
    [
        (STAGED, lambda j, i: j.mark_running(i, "w", "", 5.0)),
        (STAGED, lambda j, i: j.mark_ended(i, COMPLETED, 5.0)),
        (STAGED, lambda j, i: j.requeue(i, "x", 5.0)),
        (QUEUED, lambda j, i: j.mark_queued([i], 5.0)),
        (QUEUED, lambda j, i: j.requeue(i, "x", 5.0)),
        (QUEUED, lambda j, i: j.mark_ended(i, LOST, 5.0)),
        (RUNNING, lambda j, i: j.mark_queued([i], 5.0)),
        (RUNNING, lambda j, i: j.mark_running(i, "w", "", 5.0)),
        (COMPLETED, lambda j, i: j.mark_ended(i, FAILED, 5.0)),
        (COMPLETED, lambda j, i: j.mark_running(i, "w", "", 5.0)),
        (CANCELLED, lambda j, i: j.requeue(i, "x", 5.0)),
    ],
)
def test_illegal_moves_raise_and_change_nothing(journal: Journal, state: str, action: Any) -> None:
    run_id = in_state(journal, state)
    before = (run(journal, run_id), journal.history(run_id))
    with pytest.raises(ValueError, match=f"run {run_id} is {state}; it cannot become"):
        action(journal, run_id)
    assert (run(journal, run_id), journal.history(run_id)) == before


def in_state(journal: Journal, state: str) -> int:
    [run_id] = journal.stage([spec()], 1.0, queued=state != STAGED)
    if state in (RUNNING, *FINISHED):
        journal.mark_running(run_id, "w1", "", 2.0)
    if state in FINISHED:
        journal.mark_ended(run_id, state, 3.0)
    assert run(journal, run_id).state == state
    return run_id


def test_mark_ended_wants_a_finished_state(journal: Journal) -> None:
    with pytest.raises(ValueError, match="'running' is not a finished state"):
        journal.mark_ended(started(journal), RUNNING, 3.0)


def test_mark_queued_is_all_or_nothing(journal: Journal) -> None:
    ids = journal.stage([spec(), spec()], 1.0)
    journal.mark_queued(ids[1:], 2.0)
    with pytest.raises(ValueError, match=f"run {ids[1]} is queued"):
        journal.mark_queued(ids, 3.0)
    assert run(journal, ids[0]).state == STAGED


def test_unknown_runs_raise_key_error(journal: Journal) -> None:
    for action in (
        lambda: journal.mark_queued([99], 1.0),
        lambda: journal.mark_running(99, "w", "", 1.0),
        lambda: journal.mark_ended(99, FAILED, 1.0),
        lambda: journal.requeue(99, "x", 1.0),
        lambda: journal.set_waiting(99, "x"),
        lambda: journal.request_cancel(99, 1.0),
        lambda: journal.note(99, "x", 1.0),
        lambda: journal.history(99),
    ):
        with pytest.raises(KeyError, match="no run 99"):
            action()


def test_set_waiting_is_one_line_and_silent(journal: Journal) -> None:
    [run_id] = journal.stage([spec()], 1.0, queued=True)
    journal.set_waiting(run_id, "needs gpu=2;\n  w1 has 1")
    journal.set_waiting(run_id, "needs gpu=2; w1 has 1")
    assert run(journal, run_id).waiting == "needs gpu=2; w1 has 1"
    assert texts(journal, run_id) == ["submitted"]


def test_notes_join_the_history(journal: Journal) -> None:
    [run_id] = journal.stage([spec()], 1.0)
    journal.note(run_id, "priority raised", 2.0)
    assert journal.history(run_id) == [(1.0, "staged"), (2.0, "priority raised")]


# --- cancelling ---------------------------------------------------------------------


def test_cancelling_a_staged_run_is_immediate(journal: Journal) -> None:
    [run_id] = journal.stage([spec()], 1.0)
    assert journal.request_cancel(run_id, 2.0) == "cancelled"
    record = run(journal, run_id)
    assert (record.state, record.ended, record.reason) == (CANCELLED, 2.0, "cancelled while staged")
    assert journal.cancel_requests() == []


def test_cancelling_queued_and_running_runs_is_a_request(journal: Journal) -> None:
    queued = journal.stage([spec()], 1.0, queued=True)[0]
    running = started(journal)
    assert journal.request_cancel(queued, 2.0) == "requested"
    assert journal.request_cancel(running, 2.0) == "requested"
    assert journal.request_cancel(running, 2.5) == "requested"
    assert journal.cancel_requests() == [queued, running]
    assert run(journal, queued).state == QUEUED and run(journal, queued).cancel_requested
    assert texts(journal, running).count("cancel requested") == 1
    journal.mark_ended(running, CANCELLED, 3.0, signal=signal.SIGTERM)
    assert journal.cancel_requests() == [queued]
    assert journal.request_cancel(running, 4.0) == "finished"


# --- removing -----------------------------------------------------------------------


def test_remove_staged_and_finished_runs_with_their_logs(journal: Journal) -> None:
    staged = journal.stage([spec()], 1.0)[0]
    done = started(journal)
    journal.mark_ended(done, COMPLETED, 3.0, exit_code=0)
    journal.append_log(done, b"output\n")
    assert journal.remove([done, staged, done]) == [staged, done]
    assert journal.runs() == []
    assert not journal.log_path(done).exists()
    with pytest.raises(KeyError, match=f"no run {done}"):
        journal.history(done)
    with sqlite3.connect(journal.path) as db:
        assert db.execute("SELECT COUNT(*) FROM history").fetchone()[0] == 0


def test_remove_refuses_live_runs_and_unknown_ids_and_removes_nothing(journal: Journal) -> None:
    staged = journal.stage([spec()], 1.0)[0]
    queued = journal.stage([spec()], 1.0, queued=True)[0]
    running = started(journal)
    with pytest.raises(
        ValueError, match=f"runs {queued}, {running} are queued or running: cancel them first"
    ):
        journal.remove([staged, queued, running])
    with pytest.raises(ValueError, match=f"^run {queued} is queued or running: cancel it first"):
        journal.remove([queued])
    with pytest.raises(KeyError, match="no runs 98, 99"):
        journal.remove([staged, 99, 98])
    assert len(journal.runs()) == 3
    assert journal.remove([]) == []


def test_prune_removes_runs_that_ended_long_enough_ago(journal: Journal) -> None:
    ids = [started(journal) for _ in range(3)]
    for run_id, ended in zip(ids, (10.0, 20.0, 30.0), strict=True):
        journal.mark_ended(run_id, COMPLETED, ended, exit_code=0)
    live = started(journal)
    staged = journal.stage([spec()], 1.0)[0]
    assert journal.prune(older_than=15.0, now=40.0) == 2
    assert [r.id for r in journal.runs()] == [ids[2], live, staged]
    assert journal.prune(older_than=None, now=40.0) == 1
    assert [r.id for r in journal.runs()] == [live, staged]
    with pytest.raises(ValueError, match="older_than must be a non-negative"):
        journal.prune(older_than=-1.0, now=40.0)


# --- batches ------------------------------------------------------------------------


def test_a_batch_commits_once_at_its_end(journal: Journal) -> None:
    other = Journal(journal.path)
    with journal.batch():
        ids = journal.stage([spec()], 1.0)
        journal.mark_queued(ids, 2.0)
        assert other.runs() == []
    assert [r.state for r in other.runs()] == [QUEUED]
    other.close()


def test_a_failed_batch_changes_nothing(journal: Journal) -> None:
    [run_id] = journal.stage([spec()], 1.0)
    journal.append_log(run_id, b"x")
    with pytest.raises(RuntimeError), journal.batch():
        journal.mark_queued([run_id], 2.0)
        journal.stage([spec()], 2.0)
        journal.remove([])
        raise RuntimeError("boom")
    assert [(r.id, r.state) for r in journal.runs()] == [(run_id, STAGED)]
    assert journal.log_path(run_id).exists()


def test_a_failing_call_inside_a_batch_undoes_only_itself(journal: Journal) -> None:
    ids = journal.stage([spec(), spec()], 1.0)
    journal.mark_queued(ids[1:], 1.5)
    with journal.batch():
        journal.note(ids[0], "kept", 2.0)
        with pytest.raises(ValueError, match="is queued"):
            journal.mark_queued(ids, 2.0)  # queues ids[0], then fails on ids[1]
        with pytest.raises(RuntimeError), journal.batch():
            journal.note(ids[0], "dropped", 2.0)
            raise RuntimeError
    assert run(journal, ids[0]).state == STAGED
    assert texts(journal, ids[0]) == ["staged", "kept"]


def test_logs_of_runs_removed_in_a_batch_go_when_it_commits(journal: Journal) -> None:
    [run_id] = journal.stage([spec()], 1.0)
    journal.append_log(run_id, b"x")
    with journal.batch():
        journal.remove([run_id])
        assert journal.log_path(run_id).exists()
    assert not journal.log_path(run_id).exists()


# --- logs ---------------------------------------------------------------------------


def test_logs_append(tmp_path: Path) -> None:
    with Journal(tmp_path / "deep" / "jobs.db") as journal:
        assert journal.logs_dir == tmp_path / "deep" / "jobs-logs"
        assert journal.log_path(7) == tmp_path / "deep" / "jobs-logs" / "7.log"
        assert not journal.logs_dir.exists()
        journal.append_log(7, b"one\n")
        journal.append_log(7, b"two\n")
        assert journal.log_path(7).read_bytes() == b"one\ntwo\n"


# --- files and durability -----------------------------------------------------------


def test_a_second_journal_on_the_same_file_sees_everything(tmp_path: Path) -> None:
    with Journal(tmp_path / "runs.db") as first:
        ids = first.stage([spec(name="a"), spec(name="b")], 1.0)
        first.mark_queued(ids[:1], 2.0)
        with Journal(tmp_path / "runs.db") as second:
            assert [(r.name, r.state) for r in second.runs()] == [("a", QUEUED), ("b", STAGED)]
            second.mark_running(ids[0], "w1", "", 3.0)
        assert run(first, ids[0]).state == RUNNING


def test_two_journals_writing_in_turn_do_not_lock_each_other_out(tmp_path: Path) -> None:
    with Journal(tmp_path / "runs.db") as a, Journal(tmp_path / "runs.db") as b:
        for i in range(20):
            writer, reader = (a, b) if i % 2 else (b, a)
            [run_id] = writer.stage([spec()], float(i), queued=True)
            reader.mark_running(run_id, "w", "", float(i))
            assert [r.state for r in writer.runs(ids=[run_id])] == [RUNNING]
            writer.mark_ended(run_id, COMPLETED, float(i), exit_code=0)
        assert a.counts()[COMPLETED] == 20


def test_concurrent_writers_in_threads_wait_for_each_other(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    Journal(path).close()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with Journal(path) as journal:
                for i in range(50):
                    ids = journal.stage([spec(), spec()], float(i))
                    journal.mark_queued(ids, float(i))
                    journal.runs(states=[QUEUED])
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with Journal(path) as journal:
        assert journal.counts()[QUEUED] == 300


@pytest.mark.process
@pytest.mark.timeout(30)
def test_runs_survive_the_sigkill_of_the_process_that_wrote_them(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    code = textwrap.dedent(
        """
        import sys
        from apportion.runs.journal import Journal
        from apportion.runs.spec import new_spec
        journal = Journal(sys.argv[1])
        ids = journal.stage([new_spec(["echo", str(i)]) for i in range(5)], 1.0)
        journal.mark_queued(ids[:2], 2.0)
        journal.mark_running(ids[0], "w1", "foo=1", 3.0)
        print(ids, flush=True)
        sys.stdin.read()
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        ids = ast.literal_eval(proc.stdout.readline())
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with Journal(path) as journal:
        assert [(r.id, r.state) for r in journal.runs()] == list(
            zip(ids, [RUNNING, QUEUED, STAGED, STAGED, STAGED], strict=True)
        )
        assert run(journal, ids[4]).spec.command == ("echo", "4")
        check_invariants(journal)


def test_a_journal_from_a_newer_apportion_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    Journal(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,))
    db.close()
    with pytest.raises(JournalError, match=f"schema version {SCHEMA_VERSION + 1}, but this"):
        Journal(path)


def test_a_file_that_is_not_a_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(JournalError, match="is not a usable journal"):
        Journal(path)


def test_default_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("APPORTION_HOME", str(tmp_path))
    assert default_home() == tmp_path
    assert default_journal_path() == tmp_path / "runs.db"
    monkeypatch.delenv("APPORTION_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_home() == tmp_path / "home" / ".apportion"


def test_describe_exit() -> None:
    assert describe_exit(0, None) == "exit 0"
    assert describe_exit(None, 9) == "SIGKILL"
    assert describe_exit(None, 200) == "signal 200"
    assert describe_exit(None, None) == ""


# --- the scheduler's claim ----------------------------------------------------------


def test_one_scheduler_at_a_time(tmp_path: Path) -> None:
    with Journal(tmp_path / "runs.db") as first, Journal(tmp_path / "runs.db") as second:
        assert first.owner() is None
        first.claim("tcp://127.0.0.1:8786")
        assert second.owner() == (os.getpid(), "tcp://127.0.0.1:8786")
        with pytest.raises(JournalBusy) as info:
            second.claim("tcp://127.0.0.1:9999")
        assert str(info.value) == (
            f"journal {tmp_path / 'runs.db'} is served by the scheduler at "
            f"tcp://127.0.0.1:8786 (pid {os.getpid()})"
        )
        assert (info.value.pid, info.value.address) == (os.getpid(), "tcp://127.0.0.1:8786")
        first.release()
        assert second.owner() is None
        second.claim("tcp://127.0.0.1:9999")
        assert first.owner() == (os.getpid(), "tcp://127.0.0.1:9999")
    with Journal(tmp_path / "runs.db") as third:
        assert third.owner() is None  # closing released it


@pytest.mark.process
@pytest.mark.timeout(30)
def test_a_sigkilled_scheduler_leaves_the_journal_free(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    code = textwrap.dedent(
        """
        import sys
        from apportion.runs.journal import Journal
        journal = Journal(sys.argv[1])
        journal.claim("tcp://10.0.0.1:8786")
        print("claimed", flush=True)
        sys.stdin.read()
        """
    )
    with (
        Journal(path) as journal,
        subprocess.Popen(
            [sys.executable, "-c", code, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as proc,
    ):
        assert proc.stdout is not None
        assert proc.stdout.readline() == "claimed\n"
        assert journal.owner() == (proc.pid, "tcp://10.0.0.1:8786")
        with pytest.raises(JournalBusy, match=f"tcp://10.0.0.1:8786 \\(pid {proc.pid}\\)"):
            journal.claim("tcp://127.0.0.1:8786")
        proc.kill()
        proc.wait()
        assert journal.owner() is None
        journal.claim("tcp://127.0.0.1:8786")
        assert journal.owner() == (os.getpid(), "tcp://127.0.0.1:8786")


# --- random walks -------------------------------------------------------------------

ACTIONS = ("stage", "queue", "start", "end", "requeue", "cancel", "remove", "prune")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 5)), max_size=30))
def test_random_walks_keep_the_model_and_the_invariants(steps: list[tuple[str, int]]) -> None:
    """Any sequence of calls either follows ``RUN_MOVES`` or raises and changes nothing."""
    with tempfile.TemporaryDirectory() as tmp, Journal(Path(tmp) / "runs.db") as journal:
        model: dict[int, str] = {}
        for now, (action, pick) in enumerate(steps):
            ids = sorted(model)
            run_id = ids[pick % len(ids)] if ids else 1
            expected = step(journal, action, run_id, model.get(run_id), float(now))
            if action == "stage":
                model[journal.runs()[-1].id] = STAGED
            elif action == "prune":
                model = {i: s for i, s in model.items() if s not in FINISHED}
            elif expected == "removed":
                del model[run_id]
            elif expected is not None:
                model[run_id] = expected
            assert {r.id: r.state for r in journal.runs()} == model
            check_invariants(journal)


def step(journal: Journal, action: str, run_id: int, state: str | None, now: float) -> str | None:
    """Do one action; the state it should leave the run in, or None if it must fail."""
    targets = {"queue": QUEUED, "start": RUNNING, "end": FAILED, "requeue": QUEUED}
    if action == "stage":
        journal.stage([spec()], now)
        return None
    if action == "prune":
        journal.prune(older_than=None, now=now)
        return None
    if action == "cancel":
        if state is None:
            return None
        outcome = journal.request_cancel(run_id, now)
        return CANCELLED if outcome == "cancelled" else state
    if action == "remove":
        legal = state is not None and state not in (QUEUED, RUNNING)
    else:
        only_from = {"queue": STAGED, "requeue": RUNNING}.get(action, state)
        legal = (state, targets[action]) in RUN_MOVES and state == only_from
    try:
        if action == "queue":
            journal.mark_queued([run_id], now)
        elif action == "start":
            journal.mark_running(run_id, "w1", "foo=1", now)
        elif action == "end":
            journal.mark_ended(run_id, FAILED, now, exit_code=1)
        elif action == "requeue":
            journal.requeue(run_id, "worker lost", now)
        else:
            journal.remove([run_id])
    except (KeyError, ValueError):
        assert not legal, f"{action} on a {state} run raised"
        return state
    assert legal, f"{action} on a {state} run was allowed"
    return "removed" if action == "remove" else targets[action]
