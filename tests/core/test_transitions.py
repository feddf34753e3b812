"""The one exception of the three state machines' tables of legal moves."""

from __future__ import annotations

import pickle

import pytest

from apportion.core.transitions import IllegalTransition, check_move

MOVES = frozenset({("a", "b")})


def test_a_legal_move_passes() -> None:
    check_move(MOVES, "scheduler", "task 'x'", "a", "b")


def test_an_illegal_move_names_the_machine_the_item_and_the_move() -> None:
    with pytest.raises(IllegalTransition) as info:
        check_move(MOVES, "scheduler", "task 'x'", "b", "a", "a worker said so")
    assert str(info.value) == "scheduler: task 'x' is b; it cannot become a (a worker said so)"
    assert (info.value.machine, info.value.item) == ("scheduler", "task 'x'")
    assert (info.value.old, info.value.new) == ("b", "a")


def test_it_is_both_a_bug_and_a_bad_value() -> None:
    error = IllegalTransition("job queue", "run 3", "completed", "cancelled")
    assert isinstance(error, AssertionError) and isinstance(error, ValueError)
    assert str(error) == "job queue: run 3 is completed; it cannot become cancelled"


def test_it_survives_pickling() -> None:
    error = IllegalTransition("worker", "task 'k'", "memory", "ready", "why")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.detail == "why"
