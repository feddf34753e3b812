"""One Demand per request: parsed once, equal whatever the spelling, and carried as is."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any

import pytest

from apportion.core.demand import PLAIN, Demand, demand_of, from_wire, single
from apportion.core.resources import SCALE


def test_one_demand_from_every_spelling_users_give() -> None:
    expected = Demand(({"GPU": SCALE, "MEMORY": 16 * 2**30 * SCALE},))
    assert demand_of({"GPU": 1, "MEMORY": "16GiB"}) == expected
    assert demand_of("MEMORY=16GiB GPU=1") == expected
    assert demand_of("GPU=1,MEMORY=16GiB") == expected
    assert single({"MEMORY": "16GiB", "GPU": 1}) == expected


def test_alternatives_keep_their_order_of_preference() -> None:
    demand = demand_of([{"gpu": 1, "cpus": 1}, {"cpus": 8}])
    assert demand.alternatives == ({"gpu": SCALE, "cpus": SCALE}, {"cpus": 8 * SCALE})
    assert demand.first == {"gpu": SCALE, "cpus": SCALE}
    assert demand != demand_of([{"cpus": 8}, {"gpu": 1, "cpus": 1}])


def test_asking_for_nothing_is_the_shared_plain_demand() -> None:
    for nothing in (None, {}, "", "GPU=0"):
        assert demand_of(nothing) is PLAIN
    assert not PLAIN.asks and PLAIN.alternatives == ({},)
    assert demand_of({"GPU": 1}).asks
    assert demand_of([{}, {"GPU": 1}]).asks  # some alternative asks for something


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ([], "resources: give one demand, or a non-empty list of alternatives"),
        (5, "resources: give one demand, or a non-empty list of alternatives"),
        ({"GPU": -1}, "resource 'GPU': amount must not be negative"),
        (["GPU=1", "gpu=[0,1]"], "a task asks for an amount"),
        ("GPU", "invalid resource spec 'GPU': parts must be NAME=AMOUNT"),
    ],
)
def test_bad_requests_get_the_one_line_errors_of_the_parser(given: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        demand_of(given)


def test_equal_demands_hash_alike_whatever_their_order() -> None:
    a = Demand(({"x": 1, "y": 2},))
    b = Demand(({"y": 2, "x": 1},))
    assert a == b and hash(a) == hash(b)
    assert len({a, b, PLAIN, Demand(({},))}) == 2
    assert a != {"x": 1, "y": 2}  # a demand is not its amounts


def test_the_wire_form_round_trips_and_stays_small_for_one_alternative() -> None:
    one = demand_of({"GPU": 1})
    assert one.wire() == ({"GPU": SCALE}, [])
    assert PLAIN.wire() == ({}, [])
    assert from_wire(*PLAIN.wire()) is PLAIN
    two = demand_of([{"GPU": 1}, {}])
    assert two.wire() == ({"GPU": SCALE}, [{"GPU": SCALE}, {}])
    for demand in (one, two, PLAIN):
        assert from_wire(*demand.wire()) == demand


@pytest.mark.process
def test_a_pickled_demand_is_rebuilt_with_its_new_process_hash() -> None:
    # String hashes differ between processes: a hash carried in the pickle would put
    # the demand in the wrong bucket of every dict on the other side.
    demand = demand_of([{"gpu": 1}, {"cpus": 8}])
    assert pickle.loads(pickle.dumps(demand)) == demand
    check = (
        "import pickle, sys; from apportion.core.demand import Demand; "
        "d = pickle.loads(sys.stdin.buffer.read()); "
        "assert hash(d) == hash(Demand(d.alternatives)); "
        "assert d in {Demand(({'gpu': 10000},), ) : 0, Demand(d.alternatives): 1}"
    )
    subprocess.run(
        [sys.executable, "-c", check],
        input=pickle.dumps(demand),
        check=True,
        timeout=60,
        env={"PYTHONHASHSEED": "12345"},
    )


def test_described_for_people() -> None:
    assert demand_of({"GPU": 1}).describe() == "GPU=1"
    assert demand_of([{"gpu": 1}, {}]).describe() == "gpu=1 | nothing"
