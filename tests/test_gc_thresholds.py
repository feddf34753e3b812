"""``gc_thresholds``: raised while a scheduler or worker runs, put back after the last."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from apportion import gc_thresholds
from apportion.testing import InMemoryCluster

DEFAULT = (700, 10, 10)


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No service holding the thresholds, the interpreter's defaults; all put back."""
    before, enabled = gc.get_threshold(), gc.isenabled()
    monkeypatch.setattr(gc_thresholds, "_holders", 0)
    monkeypatch.setattr(gc_thresholds, "_found", None)
    gc.set_threshold(*DEFAULT)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if enabled:
            gc.enable()


@pytest.mark.usefixtures("collector")
def test_raised_while_held_and_put_back_after_the_last_release() -> None:
    gc_thresholds.hold_gc_thresholds()
    gc_thresholds.hold_gc_thresholds()  # a second service in the same process
    assert gc.get_threshold() == (gc_thresholds.YOUNG_THRESHOLD, 10, 10)
    gc_thresholds.release_gc_thresholds()
    assert gc.get_threshold()[0] == gc_thresholds.YOUNG_THRESHOLD  # one still runs
    gc_thresholds.release_gc_thresholds()
    assert gc.get_threshold() == DEFAULT
    gc_thresholds.release_gc_thresholds()  # one release too many changes nothing
    assert gc.get_threshold() == DEFAULT


@pytest.mark.usefixtures("collector")
def test_thresholds_someone_set_higher_are_kept() -> None:
    gc.set_threshold(100_000, 5, 5)
    gc_thresholds.hold_gc_thresholds()
    assert gc.get_threshold() == (100_000, 5, 5)
    gc_thresholds.release_gc_thresholds()
    assert gc.get_threshold() == (100_000, 5, 5)


@pytest.mark.usefixtures("collector")
def test_a_change_made_while_held_is_not_undone() -> None:
    gc_thresholds.hold_gc_thresholds()
    gc.set_threshold(1_000, 10, 10)  # the program chose its own meanwhile
    gc_thresholds.release_gc_thresholds()
    assert gc.get_threshold() == (1_000, 10, 10)


@pytest.mark.usefixtures("collector")
def test_a_collector_turned_off_is_left_alone() -> None:
    gc.disable()
    gc_thresholds.hold_gc_thresholds()
    assert gc.get_threshold() == DEFAULT and not gc.isenabled()
    gc_thresholds.release_gc_thresholds()
    assert gc.get_threshold() == DEFAULT


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("collector")
def test_an_embedded_cluster_raises_them_while_it_runs() -> None:
    with InMemoryCluster(workers=[{"nthreads": 1}, {"nthreads": 1}]):
        assert gc.get_threshold()[0] == gc_thresholds.YOUNG_THRESHOLD
    assert gc.get_threshold() == DEFAULT
