"""Resource specs: parsing into fixed-point ticks and formatting (the ledger: test_ledger)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.core.resources import (
    SCALE,
    describe_spec,
    format_amount,
    format_resources,
    from_ticks,
    parse_amount,
    parse_demand,
    parse_resources,
)

# --- parsing ------------------------------------------------------------------------


def test_space_separated_pairs() -> None:
    assert parse_resources("GPU=2 MEMORY=100e9") == {"GPU": 2 * SCALE, "MEMORY": 10**11 * SCALE}


def test_commas_and_mixed_separators() -> None:
    expected = {"GPU": 2 * SCALE, "MEMORY": 3 * SCALE, "lic": SCALE}
    assert parse_resources("GPU=2,MEMORY=3, lic=1") == expected
    assert parse_resources("  GPU=2 ,MEMORY=3\tlic=1 ") == expected


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("16GiB", 16 * 2**30),
        ("16gib", 16 * 2**30),
        ("500MB", 500 * 10**6),
        ("2k", 2000),
        ("1.5k", 1500),
        ("1TiB", 2**40),
        ("100e9", 10**11),
        ("7", 7),
        ("0", 0),
    ],
)
def test_amounts_and_suffixes(text: str, units: int) -> None:
    assert parse_resources(f"X={text}") == {"X": units * SCALE}


def test_fractions_are_exact_ticks() -> None:
    assert parse_resources("GPU=0.5") == {"GPU": SCALE // 2}
    assert parse_resources("GPU=0.0001") == {"GPU": 1}
    assert parse_amount(0.1) + parse_amount(0.2) == parse_amount(0.3)


def test_mapping_with_numbers_and_strings() -> None:
    assert parse_resources({"GPU": 1, "MEMORY": "16GiB", "lic": 0.25}) == {
        "GPU": SCALE,
        "MEMORY": 16 * 2**30 * SCALE,
        "lic": SCALE // 4,
    }


def test_none_and_empty_mean_nothing() -> None:
    assert parse_resources(None) == {}
    assert parse_resources("") == {}
    assert parse_resources({}) == {}


def test_names_may_hold_digits_dots_dashes() -> None:
    assert set(parse_resources("gpu0=1 _x=1 a.b-c_1=1")) == {"gpu0", "_x", "a.b-c_1"}


@pytest.mark.parametrize(
    ("spec", "quoted"),
    [
        ("GPU", "'GPU'"),
        ("GPU=2 MEMORY", "'MEMORY'"),
        ("GPU=-1", "'-1'"),
        ("GPU=abc", "'abc'"),
        ("=2", "'=2'"),
        ("GPU=", "'GPU='"),
        ("GPU=nan", "'nan'"),
        ("GPU=NaN", "'NaN'"),
        ("GPU=inf", "'inf'"),
        ("GPU=Infinity", "'Infinity'"),
        ("GPU=1e", "'1e'"),
        ("GPU=1.2.3", "'1.2.3'"),
        ("GPU=2xb", "'2xb'"),
        ("GPU=1=2", "'1=2'"),
        ("GPU=0.00001", "'0.00001'"),
        ("GPU=1 GPU=2", "'GPU'"),
        ("GPU=1,GPU=1", "'GPU'"),
        ("1GPU=1", "'1GPU'"),
        ("G@=1", "'G@'"),
        ("-x=1", "'-x'"),
    ],
)
def test_malformed_string_specs_quote_the_bad_part(spec: str, quoted: str) -> None:
    with pytest.raises(ValueError, match=re.escape(quoted)):
        parse_resources(spec)


def test_duplicate_name_says_twice() -> None:
    with pytest.raises(ValueError, match="given twice"):
        parse_resources("GPU=1 MEMORY=2 GPU=1")


@pytest.mark.parametrize(
    ("spec", "quoted"),
    [
        ({"GPU": -1}, "-1"),
        ({"GPU": float("nan")}, "nan"),
        ({"GPU": float("inf")}, "inf"),
        ({"GPU": True}, "True"),
        ({"GPU": "abc"}, "'abc'"),
        ({1: 2}, "1"),
        ({"": 1}, "''"),
        ({"a b": 1}, "'a b'"),
    ],
)
def test_malformed_mappings_quote_the_bad_part(spec: dict[object, object], quoted: str) -> None:
    with pytest.raises(ValueError, match=re.escape(quoted)):
        parse_resources(spec)  # type: ignore[arg-type]


def test_mapping_with_non_number_amount_is_value_error() -> None:
    with pytest.raises(ValueError, match="None"):
        parse_resources({"GPU": None})  # type: ignore[dict-item]


def test_amount_too_large_for_the_wire_is_value_error() -> None:
    with pytest.raises(ValueError, match="too large"):
        parse_resources("GPU=1e400")


@pytest.mark.parametrize("spec", [5, 2.0, [("GPU", 1)], ("GPU=1",), b"GPU=1", {"GPU"}])
def test_non_string_non_mapping_input(spec: object) -> None:
    with pytest.raises(ValueError, match=type(spec).__name__):
        parse_resources(spec)  # type: ignore[arg-type]


def test_parse_demand_drops_zero_amounts() -> None:
    assert parse_demand("GPU=0 MEMORY=1") == {"MEMORY": SCALE}
    assert parse_demand({"GPU": 0, "lic": 0.0}) == {}
    assert parse_demand(None) == {}
    # A supply keeps its zeros: a worker may declare that it offers none of a pool.
    assert parse_resources("GPU=0") == {"GPU": 0}


def test_parse_demand_still_rejects_bad_specs() -> None:
    with pytest.raises(ValueError, match="'-1'"):
        parse_demand("GPU=-1")


# --- formatting ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ticks", "text"),
    [
        (0, "0"),
        (2 * SCALE, "2"),
        (SCALE // 2, "0.5"),
        (1, "0.0001"),
        (12_345, "1.2345"),
        (10**11 * SCALE, "100000000000"),
    ],
)
def test_format_amount(ticks: int, text: str) -> None:
    assert format_amount(ticks) == text


@pytest.mark.parametrize(
    "spec",
    ["GPU=2 MEMORY=100e9", "GPU=0.5", "a=1 b=0.25 c=3", "GPU=0", "X=0.0001", "M=2k", ""],
)
def test_format_resources_round_trips(spec: str) -> None:
    amounts = parse_resources(spec)
    text = format_resources(amounts)
    assert parse_resources(text) == amounts


def test_format_resources_sorts_names() -> None:
    assert format_resources({"b": SCALE, "a": 2 * SCALE}) == "a=2 b=1"


@pytest.mark.parametrize("spec", ["MEMORY=16GiB", "MEMORY=123456789", "X=123456.5", "M=1.5TiB"])
def test_format_resources_round_trips_large_exact_amounts(spec: str) -> None:
    amounts = parse_resources(spec)
    assert parse_resources(format_resources(amounts)) == amounts


@given(st.dictionaries(st.sampled_from(["GPU", "MEM", "lic"]), st.integers(0, 10**15)))
def test_format_resources_round_trips_any_ticks(amounts: dict[str, int]) -> None:
    assert parse_resources(format_resources(amounts)) == amounts


def test_from_ticks_gives_plain_numbers() -> None:
    assert from_ticks({"GPU": 3 * SCALE // 2}) == {"GPU": 1.5}


def test_describe_spec_reads_a_stored_spec_for_people() -> None:
    stored = format_resources(parse_resources("MEMORY=50e9 gpu=[0,1] licence=0.5"))
    assert stored == "MEMORY=50000000000 gpu=2 licence=0.5"
    assert describe_spec(stored) == "MEMORY=46.6 GiB gpu=2 licence=0.5"
    assert describe_spec("gpu=[1,3] mem=16GiB") == "gpu=[1,3] mem=16 GiB"
    assert describe_spec("") == ""
    assert describe_spec("not a spec") == "not a spec"  # shown, never acted on
