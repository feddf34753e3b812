"""What a worker keeps for the scheduler while it is away (``worker/outbox.py``)."""

from __future__ import annotations

import pytest

from apportion.protocol.coordination import Publish
from apportion.protocol.services import TaskNote
from apportion.worker import outbox as outbox_module
from apportion.worker.outbox import Outbox


def test_printed_text_beyond_the_bound_is_dropped_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbox_module, "MAX_UNSENT_BYTES", 100)
    box = Outbox()
    kept = [Publish("print", b"x" * 60), TaskNote("run-1", b"end", 0)]
    for message in kept:
        box.send_or_keep(None, message)
    box.send_or_keep(None, Publish("print", b"y" * 60))  # past the bound: dropped
    box.send_or_keep(None, TaskNote("run-1", b"z" * 60, 0))  # a run's end: never dropped
    assert box.take_unsent() == [*kept, TaskNote("run-1", b"z" * 60, 0)]
