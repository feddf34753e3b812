"""The commands on a local journal: stage, runs (show, rm, prune, --watch), logs, cancel.

Each test drives the commands in-process with ``CliRunner`` against a journal in
``tmp_path``, and sets up queued, running and finished runs with the ``Journal`` API,
standing in for a scheduler. ``explain_run`` is tested on records built by hand.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

import run_records as records
from apportion.cli.run_options import (
    RUN_CONTEXT_SETTINGS,
    RunOptions,
    run_options,
    specs_from_options,
)
from apportion.cli.runs import RUN_COMMANDS, explain_run
from apportion.runs.journal import (
    CANCELLED,
    COMPLETED,
    FAILED,
    QUEUED,
    RUNNING,
    STAGED,
    Journal,
    RunRecord,
)
from apportion.runs.journal_invariants import check_invariants
from apportion.runs.spec import new_spec
from apportion.runs.table import format_run
from run_records import NOW

pytestmark = pytest.mark.timeout(30)


@click.group()
def cli() -> None:
    """Stands in for the ``apportion`` group, which registers ``RUN_COMMANDS``."""


for _command in RUN_COMMANDS:
    cli.add_command(_command)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


@pytest.fixture
def journal(path: Path) -> Iterator[Journal]:
    """The journal the commands use, opened as a scheduler would; checked at the end."""
    with Journal(path) as j:
        yield j
        check_invariants(j)


def invoke(path: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    """``apportion NAME --journal PATH ARGS...`` (before ARGS: a command follows stage's)."""
    name, *rest = args
    return CliRunner().invoke(cli, [name, "--journal", str(path), *rest], env=env)


def one_error(result: Result) -> str:
    """The single ``Error:`` line of a failed command (and nothing else on stderr)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def stage_specs(journal: Journal, count: int, **kw: Any) -> list[int]:
    kw.setdefault("cwd", "/work")
    kw.setdefault("env", {"PATH": "/usr/bin"})
    return journal.stage([new_spec(["echo", str(i)], **kw) for i in range(count)], time.time())


# --- stage ---------------------------------------------------------------------------


def test_stage_merges_resources_and_keeps_the_commands_options(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARKER", "captured")
    result = invoke(
        path,
        "stage",
        "--resources",
        "foo=1",
        "--resources",
        "bar=1 baz=0.5",
        "--name",
        "train",
        "--priority",
        "-3",
        "--retries",
        "2",
        "--time-limit",
        "1h30m",
        "--cwd",
        str(tmp_path),
        "--",
        "python",
        "train.py",
        "--name",
        "x",
    )
    assert (result.exit_code, result.output) == (0, "staged run 1 (train)\n")
    with Journal(path) as journal:
        record = journal.get(1)
    assert record is not None and record.state == STAGED
    spec = record.spec
    assert spec.command == ("python", "train.py", "--name", "x")
    assert spec.resources == "bar=1 baz=0.5 foo=1"
    assert (spec.name, spec.priority, spec.retries, spec.time_limit) == ("train", -3, 2, 5400.0)
    assert spec.cwd == str(tmp_path)
    assert spec.env["MARKER"] == "captured"


def test_stage_preemptible_marks_the_runs_and_show_says_so(path: Path) -> None:
    result = invoke(path, "stage", "--preemptible", "--array", "1-2", "--", "sleep", "{}")
    assert (result.exit_code, result.output) == (0, "staged 2 runs 1,2\n")
    with Journal(path) as journal:
        assert [r.spec.preemptible for r in journal.runs()] == [True, True]
    shown = invoke(path, "runs", "show", "2")
    assert "  preemptible: yes: the scheduler may stop it and run it again" in shown.output
    assert invoke(path, "stage", "--", "true").exit_code == 0
    assert "preemptible" not in invoke(path, "runs", "show", "3").output


def test_stage_without_dashes_takes_everything_after_the_command(path: Path) -> None:
    result = invoke(path, "stage", "echo", "--name", "x", "--", "y")
    assert (result.exit_code, result.output) == (0, "staged run 1\n")
    with Journal(path) as journal:
        record = journal.get(1)
    assert record is not None and record.spec.command == ("echo", "--name", "x", "--", "y")
    assert record.spec.name == "" and record.spec.cwd == os.getcwd()


def test_stage_an_array_substitutes_each_index(path: Path) -> None:
    result = invoke(path, "stage", "--name", "sweep", "--array", "1-3,7", "--", "run", "--seed={}")
    assert (result.exit_code, result.output) == (0, "staged 4 runs 1-4 (sweep)\n")
    with Journal(path) as journal:
        records = journal.runs()
    assert [r.spec.command for r in records] == [("run", f"--seed={i}") for i in (1, 2, 3, 7)]
    assert [(r.array_id, r.array_index, r.label()) for r in records] == [
        (1, 1, "sweep[1]"),
        (1, 2, "sweep[2]"),
        (1, 3, "sweep[3]"),
        (1, 7, "sweep[7]"),
    ]


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--resources", "foo"], "--resources"),
        (["--resources", "foo=1", "--resources", "foo=2"], "given twice"),
        (["--resources", "gpu=[0]"], "--resources"),
        (["--array", "5-1"], "backwards"),
        (["--array", "x"], "invalid array"),
        (["--time-limit", "0"], "positive"),
        (["--time-limit", "1x"], "invalid time limit"),
        (["--priority", "high"], "--priority"),
        (["--retries", "-1"], "retries"),
        (["--name", "123"], "name"),
        (["--cwd", "/no/such/dir"], "--cwd"),
        (["--resourcs", "foo=1"], "unknown option '--resourcs'"),
        (["--name", "x", "--"], "no command"),
    ],
)
def test_stage_refuses_malformed_options_in_one_line_and_stages_nothing(
    path: Path, args: list[str], mentions: str
) -> None:
    extra = [] if args[-1] == "--" else ["--", "echo", "hi"]
    result = invoke(path, "stage", *args, *extra)
    assert result.exit_code == 2
    assert mentions in one_error(result)
    assert result.stdout == ""
    assert not path.exists()  # refused before the journal was even opened


def test_the_default_journal_is_in_apportion_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    runner = CliRunner(env={"APPORTION_HOME": str(home)})
    assert runner.invoke(cli, ["runs"]).output == f"no runs (no journal at {home}/runs.db yet)\n"
    assert runner.invoke(cli, ["stage", "--", "true"]).output == "staged run 1\n"
    assert (home / "runs.db").exists()
    listing = runner.invoke(cli, ["runs"]).output.splitlines()
    assert listing[0].split() == ["ID", "NAME", "STATE", "RESOURCES", "WORKER", "AGE", "INFO"]
    assert listing[1].split()[:2] == ["1", "staged"]


def test_specs_from_options_builds_and_checks_without_a_journal(tmp_path: Path) -> None:
    run = RunOptions(command=("echo", "{}"), resources=("a=1",), array="0-2", cwd=str(tmp_path))
    specs = specs_from_options(run, env={"X": "1"})
    assert [s.command for s in specs] == [("echo", "0"), ("echo", "1"), ("echo", "2")]
    assert {(s.cwd, s.resources) for s in specs} == {(str(tmp_path), "a=1")}
    assert all(s.env == {"X": "1"} for s in specs)
    with pytest.raises(ValueError, match="--resources"):
        specs_from_options(replace(run, resources=("a=1", "a=2")))


def test_run_options_serve_another_command_alike() -> None:
    """How ``apportion submit`` reuses them: same options, same refusals."""

    @click.command(context_settings=RUN_CONTEXT_SETTINGS)
    @run_options
    @click.option("--scheduler", default="tcp://here")
    def submit(run: RunOptions, scheduler: str) -> None:
        try:
            specs = specs_from_options(run)
        except ValueError as error:
            raise click.ClickException(str(error)) from None
        click.echo(f"{scheduler} {[s.command for s in specs]} {specs[0].priority}")

    runner = CliRunner()
    ok = runner.invoke(submit, ["--priority", "5", "--array", "1,2", "echo", "{}", "--x"])
    assert ok.output == "tcp://here [('echo', '1', '--x'), ('echo', '2', '--x')] 5\n"
    bad = runner.invoke(submit, ["--time-limit", "soon", "--", "echo"])
    assert bad.exit_code == 1 and "invalid time limit 'soon'" in bad.stderr
    assert "--resources TEXT" in runner.invoke(submit, ["--help"]).output


# --- runs: the table, show, rm, prune ---------------------------------------------------


def test_runs_lists_every_run_and_filters(path: Path, journal: Journal) -> None:
    lone = stage_specs(journal, 1, resources="foo=1")
    array = journal.stage(
        [
            replace(s, array_index=i)
            for i, s in enumerate(
                [new_spec(["x"], cwd="/w", env={}, name="sweep", resources="gpu=1")] * 2
            )
        ],
        time.time(),
    )
    journal.mark_queued(array, time.time())
    journal.mark_running(array[0], "w1", "gpu=[3]", time.time())
    journal.set_waiting(array[1], "no worker has gpu=1 free")

    rows = [line.split(None, 5) for line in invoke(path, "runs").output.splitlines()]
    assert rows[0] == ["ID", "NAME", "STATE", "RESOURCES", "WORKER", "AGE  INFO"]
    assert rows[1][:4] == [str(lone[0]), "staged", "foo=1", "0s"]
    assert rows[2][:5] == ["2", "sweep[0]", "running", "gpu=[3]", "w1"]
    assert rows[3][:4] == ["3", "sweep[1]", "queued", "gpu=1"]
    assert rows[3][-1].endswith("no worker has gpu=1 free")

    def ids(*args: str) -> list[str]:
        return [line.split()[0] for line in invoke(path, "runs", *args).output.splitlines()[1:]]

    assert ids("--state", "running", "--state", "staged") == ["1", "2"]
    assert ids("--array", "2") == ["2", "3"]
    assert ids("--ids", "1,3") == ["1", "3"]
    assert ids("--array", "2", "--ids", "1-2") == ["2"]
    assert invoke(path, "runs", "--state", "failed").output == "no runs\n"
    wrong = invoke(path, "runs", "--array", "3")
    assert wrong.exit_code == 2 and "run 3 is in array 2" in one_error(wrong)


def test_runs_show_one_run(path: Path, journal: Journal) -> None:
    (run_id,) = stage_specs(journal, 1, name="train")
    journal.request_cancel(run_id, time.time())
    record = journal.get(run_id)
    assert record is not None
    shown = invoke(path, "runs", "show", str(run_id))
    assert shown.output == format_run(record, journal.history(run_id)) + "\n"
    # --journal may also come before the subcommand.
    before = CliRunner().invoke(cli, ["runs", "--journal", str(path), "show", str(run_id)])
    assert before.output == shown.output
    for bad, message in (("9", "no run 9"), ("x", "invalid run id"), ("+1", "invalid run id")):
        result = invoke(path, "runs", "show", bad)
        assert result.exit_code == 2 and message in one_error(result)


def test_listing_options_do_not_go_with_a_subcommand(path: Path, journal: Journal) -> None:
    stage_specs(journal, 1)
    result = CliRunner().invoke(cli, ["runs", "--watch", "show", "1"])
    assert result.exit_code == 2 and "--watch" in one_error(result)


def test_runs_on_a_journal_that_is_not_there_or_not_a_journal(tmp_path: Path) -> None:
    missing = invoke(tmp_path / "typo.db", "runs", "show", "1")
    assert missing.exit_code == 2 and "no journal at" in one_error(missing)
    assert not (tmp_path / "typo.db").exists()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not sqlite at all" * 100)
    broken = invoke(garbage, "runs")
    assert broken.exit_code == 1 and str(garbage) in one_error(broken)


def test_rm_removes_staged_and_finished_runs_and_refuses_busy_ones(
    path: Path, journal: Journal
) -> None:
    ids = stage_specs(journal, 5)
    journal.mark_queued(ids[1:3], time.time())
    journal.mark_running(ids[2], "w1", "", time.time())
    journal.request_cancel(ids[3], time.time())
    journal.append_log(ids[0], b"output")

    result = invoke(path, "runs", "rm", "1-3")
    assert result.exit_code == 1
    assert result.stdout == "removed run 1\n"
    assert result.stderr == (
        "refused queued or running runs 2,3: cancel them first (apportion cancel 2,3)\n"
    )
    assert journal.get(1) is None and not journal.log_path(1).exists()

    result = invoke(path, "runs", "rm", "4", "99")
    assert result.exit_code == 2
    assert result.stdout == "removed run 4\n" and "no run 99" in one_error(result)

    result = invoke(path, "runs", "rm", "--all")
    assert result.exit_code == 0
    assert result.output == (
        "removed run 5\nleft queued or running runs 2,3: cancel them first (apportion cancel 2,3)\n"
    )
    assert [r.id for r in journal.runs()] == [2, 3]
    for args in ([], ["2", "--all"]):
        refused = invoke(path, "runs", "rm", *args)
        assert refused.exit_code == 2 and "or --all" in one_error(refused)


def test_prune_removes_finished_runs_by_age(path: Path, journal: Journal) -> None:
    ids = stage_specs(journal, 3)
    now = time.time()
    journal.request_cancel(ids[0], now - 2 * 86400)
    journal.request_cancel(ids[1], now - 60)

    result = invoke(path, "runs", "prune", "--older-than", "1d")
    assert result.output == "pruned 1 finished run that ended over 1d ago\n"
    assert invoke(path, "runs", "prune").output == "pruned 1 finished run\n"
    assert [r.id for r in journal.runs()] == [ids[2]]  # staged runs stay
    bad = invoke(path, "runs", "prune", "--older-than", "a while")
    assert bad.exit_code == 2 and "--older-than" in one_error(bad)


# --- logs ----------------------------------------------------------------------------


def test_logs_prints_the_bytes_as_written(path: Path, journal: Journal) -> None:
    first, second = stage_specs(journal, 2)
    journal.append_log(first, b"line one\n\xff\xfe not utf-8\n")
    journal.append_log(first, b"no newline at the end")
    result = invoke(path, "logs", str(first))
    assert result.exit_code == 0
    assert result.stdout_bytes == b"line one\n\xff\xfe not utf-8\nno newline at the end"
    silent = invoke(path, "logs", str(second))
    assert (silent.exit_code, silent.stdout_bytes) == (1, b"")
    assert f"run {second} has not started yet, so it has no output: staged" in one_error(silent)
    unknown = invoke(path, "logs", "7")
    assert unknown.exit_code == 2 and "no run 7" in one_error(unknown)


def test_logs_of_a_run_without_output_say_why_on_stderr(path: Path, journal: Journal) -> None:
    never, waits, quiet, busy = stage_specs(journal, 4, resources="gpu=2")
    now = time.time()
    journal.request_cancel(never, now)
    journal.mark_queued([waits, quiet, busy], now)
    journal.set_waiting(waits, "needs gpu=2; w1: gpu 0 of 1 free")
    for run_id in (quiet, busy):
        journal.mark_running(run_id, "w1", "gpu=[0,1]", now)
    journal.mark_ended(quiet, COMPLETED, now, exit_code=0)

    cancelled = invoke(path, "logs", str(never))
    assert (cancelled.exit_code, cancelled.stdout_bytes) == (1, b"")
    assert one_error(cancelled) == (
        f"Error: run {never} never started, so it has no output: cancelled (cancelled while staged)"
    )
    queued = invoke(path, "logs", str(waits))
    assert (queued.exit_code, queued.stdout_bytes) == (1, b"")
    assert one_error(queued) == (
        f"Error: run {waits} has not started yet, so it has no output: queued: needs gpu=2; "
        "w1: gpu 0 of 1 free; no scheduler serves this journal now, so nothing changes "
        "until one starts"
    )
    # It ran and wrote nothing: its output is empty, and that is no error.
    completed = invoke(path, "logs", str(quiet))
    assert (completed.exit_code, completed.stdout_bytes) == (0, b"")
    assert completed.stderr.strip() == (
        f"note: run {quiet} has written no output (finished: completed (exit 0))"
    )
    running = invoke(path, "logs", str(busy))
    assert (running.exit_code, running.stdout_bytes) == (0, b"")
    assert f"note: run {busy} has written no output (running on w1 holding gpu=[0,1]" in (
        running.stderr
    )


def test_logs_follow_ends_when_another_thread_finishes_the_run(
    path: Path, journal: Journal
) -> None:
    (run_id,) = stage_specs(journal, 1)
    journal.mark_queued([run_id], time.time())
    journal.mark_running(run_id, "w1", "", time.time())
    journal.append_log(run_id, b"first\n")

    def worker() -> None:
        # Another process's view of the journal. The pause only lets --follow be
        # under way first; the output is the same whenever this runs.
        time.sleep(0.1)
        with Journal(path) as other:
            other.append_log(run_id, b"second\n")
            other.mark_ended(run_id, COMPLETED, time.time(), exit_code=0)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        result = invoke(path, "logs", str(run_id), "--follow")
    finally:
        thread.join()
    assert (result.exit_code, result.stdout_bytes) == (0, b"first\nsecond\n")
    assert "no scheduler serves this journal" in result.stderr


def test_logs_follow_of_a_finished_run_returns_at_once(path: Path, journal: Journal) -> None:
    (run_id,) = stage_specs(journal, 1)
    journal.request_cancel(run_id, time.time())
    journal.append_log(run_id, b"all there is")
    result = invoke(path, "logs", str(run_id), "-f")
    assert (result.exit_code, result.stdout_bytes) == (0, b"all there is")


# --- cancel --------------------------------------------------------------------------


def test_cancel_staged_queued_finished_and_unknown_runs(path: Path, journal: Journal) -> None:
    ids = stage_specs(journal, 4)
    journal.mark_queued(ids[1:3], time.time())
    journal.mark_running(ids[2], "w1", "", time.time())
    journal.request_cancel(ids[3], time.time())

    result = invoke(path, "cancel", "1", "2-4", "99")
    assert result.exit_code == 2
    assert result.stdout == (
        "cancelled run 1\n"
        "cancel requested for runs 2,3: no scheduler serves this journal now; "
        "they are cancelled when one starts\n"
        "run 4 already finished (cancelled)\n"
    )
    assert "no run 99" in one_error(result)
    malformed = invoke(path, "cancel", "1", "3-")
    assert malformed.exit_code == 2 and "invalid run id '3-'" in one_error(malformed)
    states = {r.id: (r.state, r.cancel_requested) for r in journal.runs()}
    assert states == {
        1: (CANCELLED, True),
        2: (QUEUED, True),
        3: (RUNNING, True),
        4: (CANCELLED, True),
    }


def test_cancel_with_a_scheduler_serving_the_journal(path: Path, journal: Journal) -> None:
    ids = stage_specs(journal, 1)
    journal.mark_queued(ids, time.time())
    journal.claim("tcp://127.0.0.1:9999")
    result = invoke(path, "cancel", str(ids[0]))
    assert (result.exit_code, result.output) == (
        0,
        "cancel requested for run 1 (the scheduler stops it and frees its resources "
        "once its processes are gone)\n",
    )


# --- runs --watch --------------------------------------------------------------------


def test_watch_follows_one_array_until_it_is_done(path: Path, journal: Journal) -> None:
    stage_specs(journal, 1)  # staged, with no scheduler: never started, not waited for
    array = journal.stage(
        [replace(new_spec(["x"], cwd="/w", env={}), array_index=i) for i in range(2)],
        time.time(),
    )
    journal.mark_queued(array, time.time())

    def scheduler() -> None:
        time.sleep(0.05)  # lets --watch start first; the output ends the same either way
        with Journal(path) as other:
            for run_id in array:
                other.mark_running(run_id, "w1", "", time.time())
                other.mark_ended(run_id, COMPLETED, time.time(), exit_code=0)

    thread = threading.Thread(target=scheduler)
    thread.start()
    try:
        result = invoke(path, "runs", "--watch", "--array", str(array[0]), "--interval", "0.01")
    finally:
        thread.join()
    assert result.exit_code == 0 and "\r" not in result.output
    *progress, last = result.output.splitlines()
    assert last == "2 runs: 2 completed"
    assert progress[-1].startswith("[##############################] 2/2 done  (2 completed")
    # Not a TTY: a line only when something changed.
    assert all(a != b for a, b in itertools.pairwise(progress))


def test_watch_ends_when_staged_runs_have_no_scheduler(path: Path, journal: Journal) -> None:
    ids = stage_specs(journal, 2)
    journal.request_cancel(ids[0], time.time())
    result = invoke(path, "runs", "--watch")
    assert result.exit_code == 0
    assert result.output.splitlines() == [
        "[###############---------------] 1/2 done  (1 cancelled; 1 staged)",
        "2 runs: 1 cancelled, 1 staged",
        f"1 staged: no scheduler serves {path} now to start them",
    ]


def test_watch_waits_for_staged_runs_while_a_scheduler_serves(path: Path, journal: Journal) -> None:
    (run_id,) = stage_specs(journal, 1)
    journal.claim("tcp://127.0.0.1:9999")

    def scheduler() -> None:
        time.sleep(0.05)  # lets --watch start first; the output ends the same either way
        with Journal(path) as other:
            other.mark_queued([run_id], time.time())
            other.mark_running(run_id, "w1", "", time.time())
            other.mark_ended(run_id, FAILED, time.time(), exit_code=3)

    thread = threading.Thread(target=scheduler)
    thread.start()
    try:
        result = invoke(path, "runs", "--watch", "--interval", "0.01")
    finally:
        thread.join()
    assert result.output.splitlines()[-1] == "1 run: 1 failed"


# --- explain_run ---------------------------------------------------------------------

OWNER = (4242, "tcp://10.0.0.1:8786")


def record(state: str, **overrides: Any) -> RunRecord:
    return records.record(7, state=state, resources="gpu=1 mem=4GiB", created=NOW - 60, **overrides)


@pytest.mark.parametrize(
    ("run", "owner", "expected"),
    [
        (
            record(STAGED),
            None,
            "staged: waiting for a scheduler with this journal to start "
            "(apportion scheduler --run-once or a long-lived one)",
        ),
        (
            record(STAGED),
            OWNER,
            "staged: the scheduler at tcp://10.0.0.1:8786 (pid 4242) serves this journal "
            "and has not queued it yet",
        ),
        (record(QUEUED), OWNER, "queued: waiting for a worker where gpu=1 mem=4 GiB are free"),
        (
            record(QUEUED, spec=new_spec(["x"], cwd="/w", env={})),
            OWNER,
            "queued: waiting for a free worker",
        ),
        (
            record(QUEUED, waiting="no worker has gpu=1 free (2 workers have gpu, all busy)"),
            OWNER,
            "queued: no worker has gpu=1 free (2 workers have gpu, all busy)",
        ),
        (
            record(QUEUED, attempts=1, started=NOW, reason="worker w1 vanished"),
            OWNER,
            "queued: waiting for a worker where gpu=1 mem=4 GiB are free "
            "(after attempt 1: worker w1 vanished)",
        ),
        (
            record(QUEUED),
            None,
            "queued: waiting for a worker where gpu=1 mem=4 GiB are free; no scheduler serves "
            "this journal now, so nothing changes until one starts",
        ),
        (
            record(RUNNING, worker="w1", held="gpu=[2] mem=4GiB", started=NOW, attempts=1),
            OWNER,
            "running on w1 holding gpu=[2] mem=4 GiB since 2023-11-14 22:13:20",
        ),
        (
            record(RUNNING, worker="w1", started=NOW, attempts=2, preemptions=1),
            OWNER,
            "running on w1 since 2023-11-14 22:13:20 (attempt 2; 1 earlier attempts "
            "preempted to let another share in)",
        ),
        (
            record(QUEUED, attempts=1, preemptions=1, reason="preempted for share 'bob'"),
            OWNER,
            "queued: waiting for a worker where gpu=1 mem=4 GiB are free "
            "(after attempt 1: preempted for share 'bob')",
        ),
        (
            record(RUNNING, worker="w1", started=NOW, attempts=1, cancel_requested=True),
            OWNER,
            "cancel requested; running on w1 since 2023-11-14 22:13:20",
        ),
        (record(COMPLETED, ended=NOW, exit_code=0), None, "finished: completed (exit 0)"),
        (
            record(FAILED, ended=NOW, signal=9, reason="timed out after 1h"),
            OWNER,
            "finished: failed (SIGKILL): timed out after 1h",
        ),
        (
            record(CANCELLED, ended=NOW, reason="cancelled while staged"),
            None,
            "finished: cancelled: cancelled while staged",
        ),
    ],
)
def test_explain_run(run: RunRecord, owner: tuple[int, str] | None, expected: str) -> None:
    assert explain_run(run, owner, tz=UTC) == expected


def test_explain_run_shows_local_time_by_default() -> None:
    run = record(RUNNING, worker="w1", started=NOW, attempts=1)
    local = datetime.fromtimestamp(NOW).strftime("%Y-%m-%d %H:%M:%S")
    assert explain_run(run, OWNER) == f"running on w1 since {local}"
