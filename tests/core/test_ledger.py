"""A worker's ledger: fits, take, give, units; never negative, never given twice."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.core.ledger import Ledger, LedgerError, pick_units
from apportion.core.resources import SCALE, parse_demand, parse_resources, parse_supply


def test_fits_take_give() -> None:
    ledger = Ledger(parse_resources("GPU=2 MEMORY=100"))
    demand = parse_demand("GPU=1.5 MEMORY=10")
    assert ledger.fits(demand) and ledger.can_take(demand, None)
    assert ledger.take(demand) == {}
    assert ledger.free == {"GPU": SCALE // 2, "MEMORY": 90 * SCALE}
    assert not ledger.fits(demand)
    assert ledger.fits({})
    ledger.give(demand, {})
    assert ledger.free == ledger.total
    ledger.check()


def test_take_refuses_to_overcommit_and_give_to_double_release() -> None:
    ledger = Ledger({"GPU": SCALE})
    with pytest.raises(LedgerError, match="over-committed"):
        ledger.take({"GPU": 2 * SCALE})
    with pytest.raises(LedgerError, match="twice"):
        ledger.give({"GPU": 1}, None)


def test_missing_against_totals() -> None:
    ledger = Ledger(parse_resources("GPU=2 MEMORY=100"))
    assert ledger.missing(parse_demand("GPU=4 lic=1 MEMORY=50")) == {
        "GPU": 2 * SCALE,
        "lic": SCALE,
    }
    assert ledger.missing(parse_demand("GPU=2")) == {}


def test_held_back_amounts_are_not_available() -> None:
    ledger = Ledger(parse_resources("GPU=2"))
    assert ledger.available("GPU", {"GPU": SCALE}) == SCALE
    assert not ledger.can_take({"GPU": 2 * SCALE}, {"GPU": SCALE})
    assert ledger.can_take({"GPU": SCALE}, {"GPU": SCALE})


def test_units_whole_and_shared() -> None:
    ledger = Ledger(*parse_supply("gpu=[0-2]"))
    assert ledger.take({"gpu": 2 * SCALE}) == {"gpu": ["0", "1"]}
    assert ledger.take({"gpu": SCALE // 2}) == {"gpu": ["2"]}
    assert not ledger.can_take({"gpu": SCALE // 2 + 1}, None)  # 0.5 free in total, no room
    assert ledger.has_unit_room("gpu", SCALE // 2) and not ledger.has_unit_room("gpu", SCALE)
    ledger.give({"gpu": SCALE // 2}, {"gpu": ["2"]})
    ledger.check()
    with pytest.raises(LedgerError, match="twice"):
        ledger.give({"gpu": SCALE // 2}, {"gpu": ["2"]})


def test_given_units_are_taken_exactly_or_picked() -> None:
    ledger = Ledger(*parse_supply("gpu=[0-3]"))
    assert ledger.take({"gpu": 2 * SCALE}, {"gpu": ["3", "1"]}) == {"gpu": ["3", "1"]}
    # A label it does not have: the units are picked instead.
    assert ledger.take({"gpu": SCALE}, {"gpu": ["9"]}) == {"gpu": ["0"]}
    ledger.check()


def test_could_hold_refuses_fractions_of_several_units() -> None:
    ledger = Ledger(*parse_supply("gpu=[0-3] MEMORY=10"))
    assert ledger.could_hold({"gpu": 3 * SCALE, "MEMORY": SCALE})
    assert not ledger.could_hold({"gpu": 3 * SCALE // 2})
    assert not ledger.could_hold({"MEMORY": 11 * SCALE})
    assert pick_units({"0": SCALE}, 3 * SCALE // 2) is None


_fraction = st.decimals(min_value="0.0001", max_value="3", places=4).map(str)


@given(
    st.lists(
        st.tuples(st.sampled_from(["GPU", "MEM", "lic"]), _fraction),
        min_size=1,
        max_size=200,
    ),
    st.randoms(use_true_random=False),
)
def test_many_fractional_takes_and_gives_restore_free_exactly(
    demands: list[tuple[str, str]], rnd: random.Random
) -> None:
    parsed = [parse_demand({name: amount}) for name, amount in demands]
    ledger = Ledger({name: sum(d.get(name, 0) for d in parsed) for name in ("GPU", "MEM", "lic")})
    for demand in parsed:
        assert ledger.fits(demand)
        ledger.take(demand)
    assert all(v == 0 for v in ledger.free.values())
    rnd.shuffle(parsed)
    for demand in parsed:
        ledger.give(demand, None)
    assert ledger.free == ledger.total


_unit_demand = st.sampled_from([1, SCALE // 4, SCALE // 2, SCALE, 2 * SCALE, 3 * SCALE])


@given(
    st.lists(st.tuples(st.booleans(), _unit_demand, st.integers(0, 50)), max_size=60),
    st.integers(1, 4),
)
def test_units_take_give_round_trip_never_negative_nor_given_twice(
    steps: list[tuple[bool, int, int]], pool: int
) -> None:
    ledger = Ledger({"gpu": pool * SCALE, "MEM": 3 * SCALE}, {"gpu": [str(i) for i in range(pool)]})
    held: list[tuple[dict[str, int], dict[str, list[str]]]] = []
    for take, need, pick in steps:
        demand = {"gpu": need, "MEM": SCALE // 2}
        if take and ledger.can_take(demand, None):
            held.append((demand, ledger.take(demand)))
        elif not take and held:
            ledger.give(*held.pop(pick % len(held)))
        ledger.check()
        assert all(v >= 0 for v in ledger.free.values())
    for demand, units in held:
        ledger.give(demand, units)
    assert ledger.free == ledger.total
    assert all(left == SCALE for left in ledger.units["gpu"].values())
    with pytest.raises(LedgerError, match="twice"):
        ledger.give({"gpu": 1, "MEM": 1}, None)
