"""What ``apportion runs`` prints: tables, details, progress and summaries."""

from __future__ import annotations

import signal
from datetime import UTC
from typing import Any

import pytest

from apportion.runs.journal import (
    CANCELLED,
    COMPLETED,
    FAILED,
    LOST,
    RUNNING,
    STAGED,
    STATES,
    RunRecord,
)
from apportion.runs.table import (
    format_duration,
    format_run,
    format_runs,
    outcome,
    progress_line,
    summary,
)
from run_records import NOW, record


def running(run_id: int = 1, **overrides: Any) -> RunRecord:
    fields = {"state": RUNNING, "worker": "w1", "started": NOW - 10, "attempts": 1}
    return record(run_id, **(fields | overrides))


def ended(run_id: int, state: str, **overrides: Any) -> RunRecord:
    return running(run_id, **({"state": state, "ended": NOW - 5} | overrides))


# --- the table ----------------------------------------------------------------------


def test_the_table() -> None:
    records = [
        record(1, name="prep", state=STAGED, created=NOW - 3),
        running(2, name="sweep", array_id=2, array_index=0, held="foo=1 gpu=[1]"),
        record(3, array_id=2, array_index=1, waiting="no worker has foo=1 free"),
        ended(10, COMPLETED, exit_code=0, created=NOW - 7200, resources=""),
        ended(11, FAILED, signal=signal.SIGKILL, created=NOW - 5 * 86400),
        ended(12, FAILED, signal=signal.SIGTERM, reason="timed out after 10m", worker="w2"),
        running(13, cancel_requested=True, created=NOW - 300),
    ]
    assert format_runs(records, NOW) == "\n".join(
        [
            "ID  NAME      STATE      RESOURCES      WORKER  AGE  INFO",
            " 1  prep      staged     foo=1                  3s",
            " 2  sweep[0]  running    foo=1 gpu=[1]  w1      30s",
            " 3  [1]       queued     foo=1                  30s  no worker has foo=1 free",
            "10            completed                 w1      2h   exit 0",
            "11            failed     foo=1          w1      5d   SIGKILL",
            "12            failed     foo=1          w2      30s  timed out",
            "13            running    foo=1          w1      5m   cancel requested",
        ]
    )


def test_byte_pools_read_in_binary_units_as_everywhere_else() -> None:
    asked = record(1, resources="gpu=1 memory=50e9")
    holding = running(2, resources="memory=50e9", held="gpu=[1] memory=50000000000")
    table = format_runs([asked, holding], NOW).splitlines()
    assert "gpu=1 memory=46.6 GiB" in table[1] and "50000000000" not in table[1]
    assert "gpu=[1] memory=46.6 GiB" in table[2]
    detail = format_run(holding, [], tz=UTC)
    assert "  resources:   memory=46.6 GiB" in detail
    assert "  held:        gpu=[1] memory=46.6 GiB" in detail


def test_no_runs() -> None:
    assert format_runs([], NOW) == "no runs"


def test_a_restarted_run_shows_its_attempt() -> None:
    assert format_runs([running(attempts=3)], NOW).splitlines()[1].endswith("attempt 3")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"state": COMPLETED, "exit_code": 0}, "exit 0"),
        ({"state": FAILED, "exit_code": 2, "reason": "exited with 2"}, "exit 2"),
        ({"state": FAILED, "signal": 9}, "SIGKILL"),
        ({"state": FAILED, "signal": 15, "reason": "timed out after 1h"}, "timed out"),
        ({"state": CANCELLED, "reason": "cancelled while staged"}, "cancelled while staged"),
        (
            {"state": LOST, "reason": "worker w1 vanished " + "x" * 60},
            "worker w1 vanished " + "x" * 18 + "...",
        ),
        ({"state": RUNNING}, ""),
    ],
)
def test_outcomes(overrides: dict[str, Any], expected: str) -> None:
    assert outcome(running(**overrides)) == expected


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-4, "0s"),
        (0, "0s"),
        (59.9, "59s"),
        (60, "1m"),
        (3599, "59m"),
        (3600, "1h"),
        (86399, "23h"),
        (86400, "1d"),
        (400 * 86400, "400d"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# --- one run ------------------------------------------------------------------------


def test_format_run_of_a_failed_array_element() -> None:
    failed = ended(
        7,
        FAILED,
        name="sweep",
        command=["python", "train.py", "--note", "it's 2"],
        array_id=5,
        array_index=2,
        held="foo=1 gpu=[0]",
        attempts=2,
        exit_code=1,
        reason="exited with 1 after 2 attempts",
        time_limit=5400,
        retries=1,
        created=NOW - 100,
        started=NOW - 50,
        ended=NOW - 20,
    )
    history = [(NOW - 100, "staged"), (NOW - 50, "started on w1 holding gpu=[0] foo=1")]
    assert format_run(failed, history, tz=UTC) == "\n".join(
        [
            "run 7  sweep[2]",
            "  state:       failed (exit 1)",
            "  command:     python train.py --note 'it'\"'\"'s 2'",
            "  cwd:         /work",
            "  resources:   foo=1",
            "  held:        foo=1 gpu=[0]",
            "  worker:      w1",
            "  array:       element 2 of array 5",
            "  priority:    0",
            "  retries:     1",
            "  time limit:  1h30m",
            "  environment: 2 variables, as at submission",
            "  created:     2023-11-14 22:11:40",
            "  started:     2023-11-14 22:12:30",
            "  ended:       2023-11-14 22:13:00",
            "  attempts:    2",
            "  exit:        exit 1",
            "  reason:      exited with 1 after 2 attempts",
            "history:",
            "  2023-11-14 22:11:40  staged",
            "  2023-11-14 22:12:30  started on w1 holding gpu=[0] foo=1",
        ]
    )


def test_format_run_of_a_waiting_run() -> None:
    waiting = record(3, resources="", waiting="behind 4 runs", cancel_requested=True)
    text = format_run(waiting, [], tz=UTC)
    assert text.splitlines()[:2] == ["run 3", "  state:       queued"]
    assert "  resources:   none" in text
    assert "  time limit:  none" in text
    assert "  waiting:     behind 4 runs" in text
    assert "  cancel:      requested" in text
    assert "started:" not in text and "exit:" not in text
    assert text.endswith("history:\n  (none)")


def test_a_preempted_run_says_so_in_the_table_and_in_detail() -> None:
    why = "preempted for share 'bob', which waited 1.0s below its fair share for gpu=1"
    queued = record(
        4, preemptible=True, attempts=1, preemptions=1, reason=why, waiting="needs gpu=1"
    )
    again = running(5, preemptible=True, attempts=2, preemptions=1, reason=why)
    lost = record(6, attempts=2, preemptions=1, reason="its worker w1 left")
    rows = format_runs([queued, again, lost], NOW).splitlines()
    assert rows[1].endswith("  preempted; needs gpu=1")
    assert rows[2].endswith("  attempt 2 (1 preempted)")
    assert rows[3].endswith("  30s")  # requeued since for another reason: not "preempted"
    text = format_run(queued, [], tz=UTC)
    assert "  preempted:   1 (not failures: no retry used)" in text
    assert "  preemptible: yes: the scheduler may stop it and run it again" in text
    assert "preempt" not in format_run(record(7), [], tz=UTC)


def test_format_run_in_local_time_by_default() -> None:
    assert "  created:" in format_run(record(), [(NOW, "staged")])


# --- progress and summary -----------------------------------------------------------


def counts(**given: int) -> dict[str, int]:
    return dict.fromkeys(STATES, 0) | given


def test_progress_line() -> None:
    line = progress_line(counts(completed=5, failed=2, running=3, queued=10), width=20)
    assert line == (
        "[#######-------------]  7/20 done  (5 completed, 2 failed; 3 running, 10 queued)"
    )
    assert progress_line(counts(completed=19, queued=1), width=10).startswith("[#########-]")


def test_progress_line_at_the_start_and_the_end() -> None:
    assert progress_line(counts(staged=4), width=4) == "[----] 0/4 done  (4 staged)"
    assert progress_line(counts(completed=3), width=4) == "[####] 3/3 done  (3 completed)"
    assert progress_line(counts(), width=4) == "[----] 0/0 done"
    assert len(progress_line(counts(queued=1))) == len("[] 0/1 done  (1 queued)") + 30


def test_progress_line_refuses_a_bar_of_no_width() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        progress_line(counts(), width=0)


def test_summary() -> None:
    assert summary(counts(completed=18, failed=2)) == "20 runs: 18 completed, 2 failed"
    assert summary(counts(lost=1)) == "1 run: 1 lost"
    assert summary(counts(cancelled=1, running=2, queued=3)) == (
        "6 runs: 1 cancelled, 2 running, 3 queued"
    )
    assert summary(counts()) == "no runs"
    assert summary({"completed": 1, "mystery": 2}) == "3 runs: 1 completed, 2 mystery"
