"""The job queue's writer thread: journal commands in order, output in batches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apportion.runs import run_events as e
from apportion.runs.journal import COMPLETED, RUNNING, Journal
from apportion.runs.spec import new_spec
from apportion.runs.writer import JournalWriter

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    opened = Journal(tmp_path / "runs.db")
    yield opened
    opened.close()


def test_commands_apply_in_order_and_calls_answer_after_them(journal: Journal) -> None:
    (run_id,) = journal.stage([new_spec(["true"])], 0.0, queued=True)
    writer = JournalWriter(journal)
    try:
        writer.write([e.NewAttempt(run_id, 0), e.MarkRunning(run_id, "w1", "", 1.0)])
        state = writer.call(lambda j: j.get(run_id).state)  # type: ignore[union-attr]
        writer.write([e.MarkEnded(run_id, COMPLETED, 0, None, "", 2.0)])
        assert state.result(5) == RUNNING
        writer.sync().result(5)
        assert journal.get(run_id).state == COMPLETED  # type: ignore[union-attr]
    finally:
        writer.close()


def test_output_is_written_in_batches_and_in_order(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    (run_id,) = journal.stage([new_spec(["true"])], 0.0, queued=True)
    appends: list[int] = []
    original = journal.append_log

    def counted(run: int, data: bytes) -> None:
        appends.append(len(data))
        original(run, data)

    monkeypatch.setattr(journal, "append_log", counted)
    writer = JournalWriter(journal)
    try:
        writer.write([e.NewAttempt(run_id, 0)])
        offset = 0
        for i in range(1000):
            chunk = f"line {i}\n".encode()
            writer.output(run_id, offset, chunk)
            offset += len(chunk)
        writer.sync().result(5)
    finally:
        writer.close()
    expected = "".join(f"line {i}\n" for i in range(1000))
    assert journal.log_path(run_id).read_text() == expected
    assert len(appends) < 100  # not one file open per chunk


def test_a_failing_command_is_logged_and_the_rest_applied(
    journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    (run_id,) = journal.stage([new_spec(["true"])], 0.0, queued=True)
    writer = JournalWriter(journal)
    try:
        writer.write([e.Requeue(run_id, "not running", 1.0), e.Note(run_id, "still here", 1.0)])
        writer.sync().result(5)
    finally:
        writer.close()
    assert "Requeue failed" in caplog.text
    assert any(text == "still here" for _, text in journal.history(run_id))


def test_close_writes_what_is_buffered(journal: Journal) -> None:
    echoed: list[bytes] = []
    writer = JournalWriter(journal, echo=echoed.append)
    writer.output(7, 0, b"last words\n")
    writer.close()
    assert journal.log_path(7).read_bytes() == b"last words\n" == b"".join(echoed)
