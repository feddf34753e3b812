"""The memory policy alone: samples in, decisions out, no process, no clock, no disk."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.worker.events import Paused, Resumed
from apportion.worker.memory_policy import (
    NOTHING,
    Fraction,
    MemoryDecision,
    MemoryLimits,
    MemorySample,
    MemoryThresholds,
    decide,
    parse_fraction,
)

pytestmark = pytest.mark.timeout(30)

LIMIT = 1000
DASK = MemoryLimits.of(LIMIT, MemoryThresholds())


def sample(process: int, managed: int = 0, t: float = 1.0) -> MemorySample:
    return MemorySample(t, process, managed)


# --- examples with Dask's defaults: target 600, spill 700, pause 800 ------------------


def test_the_defaults_are_dasks() -> None:
    assert MemoryThresholds() == MemoryThresholds(0.6, 0.7, 0.8, 0.95)
    assert (DASK.target, DASK.spill, DASK.pause, DASK.terminate) == (600, 700, 800, 950)


def test_managed_memory_above_target_spills_the_excess() -> None:
    assert decide(DASK, sample(650, managed=650), False) == MemoryDecision(
        spill=50, store_target=600
    )
    assert decide(DASK, sample(650, managed=600), False) == MemoryDecision(store_target=600)


def test_process_memory_above_spill_spills_down_to_target() -> None:
    decision = decide(DASK, sample(750, managed=300), False)
    assert decision.spill == 150 and decision.change is None and decision.unmanaged_excess == 0
    # Between target and spill, process memory alone spills nothing (Dask's rule);
    # the store's writes may only fill what is left under spill.
    assert decide(DASK, sample(690, managed=300), False) == MemoryDecision(store_target=310)


def test_memory_outside_the_store_is_measured_and_not_overspilled() -> None:
    decision = decide(DASK, sample(750, managed=100), False)
    assert decision.spill == 100  # everything there is
    assert decision.unmanaged_excess == 50  # 750 - 600 - 100 left above target


def test_with_target_off_process_memory_spills_down_to_spill() -> None:
    limits = MemoryLimits.of(LIMIT, MemoryThresholds(target=False))
    assert decide(limits, sample(750, managed=10_000), False).spill == 50
    assert decide(limits, sample(700, managed=10_000), False) == NOTHING  # no managed rule


def test_with_spill_off_only_the_managed_rule_spills() -> None:
    limits = MemoryLimits.of(LIMIT, MemoryThresholds(spill=False))
    assert decide(limits, sample(990, managed=100), False).spill == 0


def test_writes_may_fill_memory_up_to_target_and_no_further_than_spill() -> None:
    # 100 of the process is the interpreter: the whole target fits under spill.
    assert decide(DASK, sample(100), False).store_target == 600
    # 400 outside the store (a task's temporaries): only 300 of results fit under spill.
    assert decide(DASK, sample(500, managed=100), False).store_target == 300
    # More than spill outside the store: every result written goes to disk.
    assert decide(DASK, sample(900, managed=50), False).store_target == 0
    # Results counted larger than the process (a view's base): nothing is outside.
    assert decide(DASK, sample(300, managed=500), False).store_target == 600


def test_the_store_target_follows_the_thresholds_turned_off() -> None:
    no_target = MemoryLimits.of(LIMIT, MemoryThresholds(target=False))
    assert decide(no_target, sample(500, managed=100), False).store_target is None
    no_spill = MemoryLimits.of(LIMIT, MemoryThresholds(spill=False))
    assert decide(no_spill, sample(900, managed=50), False).store_target == 600


def test_pause_above_the_threshold_and_resume_at_or_below_it() -> None:
    pause = decide(DASK, sample(801, managed=0), False)
    assert pause.change == Paused(801, LIMIT, 1.0)
    assert decide(DASK, sample(900, managed=0, t=2.0), True).change is None
    # Dask's rule, no hysteresis: back at the threshold is enough.
    assert decide(DASK, sample(800, t=3.0), True).change == Resumed(800, LIMIT, 3.0)
    assert decide(DASK, sample(100, t=4.0), False) == MemoryDecision(store_target=600)


def test_pause_off_never_pauses_and_releases_a_paused_worker() -> None:
    limits = MemoryLimits.of(LIMIT, MemoryThresholds(pause=False))
    assert decide(limits, sample(999), False).change is None
    assert isinstance(decide(limits, sample(999), True).change, Resumed)


def test_without_a_limit_nothing_applies() -> None:
    limits = MemoryLimits.of(0, MemoryThresholds())
    assert (limits.target, limits.spill, limits.pause, limits.terminate) == (None,) * 4
    assert decide(limits, sample(10**12, managed=10**12), False) == NOTHING


def test_a_result_above_the_terminate_threshold_is_not_kept() -> None:
    assert DASK.largest_result == 950  # the supervisor kills the process above it
    assert DASK.keeps(950) and not DASK.keeps(951)
    no_terminate = MemoryLimits.of(LIMIT, MemoryThresholds(terminate=False))
    assert no_terminate.largest_result == LIMIT  # then the limit itself
    assert no_terminate.keeps(LIMIT) and not no_terminate.keeps(LIMIT + 1)
    unlimited = MemoryLimits.of(0, MemoryThresholds())
    assert unlimited.largest_result is None and unlimited.keeps(10**15)


def test_unused_receive_memory_kept_is_a_quarter_of_the_fetch_budget() -> None:
    assert DASK.fetch_budget == 100 and DASK.receive_pool_budget == 25
    unlimited = MemoryLimits.of(0, MemoryThresholds())
    assert unlimited.fetch_budget is None and unlimited.receive_pool_budget is None


def test_fractions_take_dasks_forms_and_off() -> None:
    assert parse_fraction("0.6", "target") == 0.6
    assert parse_fraction(0.5, "target") == 0.5
    assert parse_fraction(1, "pause") == 1.0
    for off in ("off", "False", "false", " OFF ", False):
        assert parse_fraction(off, "spill") is False
    for bad in ("lots", 0, 1.5, -0.1, "0", True, None, [0.5]):
        with pytest.raises(ValueError, match="target"):
            parse_fraction(bad, "target")
    with pytest.raises(ValueError, match="pause"):
        MemoryThresholds(pause=2.0)
    assert MemoryThresholds(pause=False).describe() == (
        "target 0.6, spill 0.7, pause off, terminate 0.95"
    )


# --- invariants, for any limit, thresholds and sample -------------------------------

fractions: st.SearchStrategy[Fraction] = st.one_of(
    st.just(False), st.floats(min_value=0.001, max_value=1.0)
)
thresholds = st.builds(MemoryThresholds, fractions, fractions, fractions, fractions)
limits = st.builds(MemoryLimits.of, st.integers(0, 2**40), thresholds)


@st.composite
def situations(draw: st.DrawFn) -> tuple[MemoryLimits, MemorySample, bool]:
    chosen = draw(limits)
    top = 2 * max(chosen.limit, 1)
    memory = MemorySample(
        draw(st.floats(0, 1e9)), draw(st.integers(0, top)), draw(st.integers(0, top))
    )
    return chosen, memory, draw(st.booleans())


@given(situations())
def test_never_spills_more_than_is_managed_nor_below_the_floor(
    situation: tuple[MemoryLimits, MemorySample, bool],
) -> None:
    chosen, memory, paused = situation
    decision = decide(chosen, memory, paused)
    assert 0 <= decision.spill <= memory.managed
    if decision.spill:
        floor = chosen.floor
        assert floor is not None
        # What is left, by the larger of the two measures, is not below what it aims at.
        assert max(memory.managed, memory.process) - decision.spill >= floor
    assert decision.unmanaged_excess >= 0


@given(situations())
def test_spills_exactly_when_a_threshold_is_passed(
    situation: tuple[MemoryLimits, MemorySample, bool],
) -> None:
    chosen, memory, paused = situation
    decision = decide(chosen, memory, paused)
    over_target = chosen.target is not None and memory.managed > chosen.target
    over_spill = chosen.spill is not None and memory.process > chosen.spill
    if chosen.target is not None and over_target:
        assert memory.managed - decision.spill <= chosen.target  # back under target
    if not over_target and not (over_spill and chosen.floor is not None):
        assert decision.spill == 0
    if over_spill and not over_target and memory.managed and chosen.floor is not None:
        # Down to target: nothing to do if target sits above the spill threshold (over
        # target, the managed data alone is reason to spill, checked above).
        assert (decision.spill > 0) == (memory.process > chosen.floor)
    if decision.unmanaged_excess:
        assert over_spill and decision.spill == memory.managed


@given(situations())
def test_writes_keep_the_process_under_spill_and_results_under_target(
    situation: tuple[MemoryLimits, MemorySample, bool],
) -> None:
    chosen, memory, paused = situation
    allowed = decide(chosen, memory, paused).store_target
    if not chosen.limit or chosen.target is None:
        assert allowed is None
        return
    assert allowed is not None and 0 <= allowed <= chosen.target
    if chosen.spill is not None and allowed:
        outside = max(0, memory.process - memory.managed)
        assert outside + allowed <= chosen.spill


@given(situations())
def test_paused_exactly_while_above_pause_and_each_change_said_once(
    situation: tuple[MemoryLimits, MemorySample, bool],
) -> None:
    chosen, memory, paused = situation
    decision = decide(chosen, memory, paused)
    if not chosen.limit:
        return  # without a limit nothing at all (below)
    should = chosen.pause is not None and memory.process > chosen.pause
    if should and not paused:
        assert decision.change == Paused(memory.process, chosen.limit, memory.time)
    elif paused and not should:
        assert decision.change == Resumed(memory.process, chosen.limit, memory.time)
    else:
        assert decision.change is None
    # The same sample again, once the change is made, changes nothing more.
    now_paused = paused if decision.change is None else isinstance(decision.change, Paused)
    assert decide(chosen, memory, now_paused).change is None


@given(st.integers(-(2**40), 0), thresholds, situations())
def test_without_a_limit_nothing_at_all(
    limit: int, chosen: MemoryThresholds, situation: tuple[MemoryLimits, MemorySample, bool]
) -> None:
    _, memory, paused = situation
    assert decide(MemoryLimits.of(limit, chosen), memory, paused) == NOTHING
