"""Run specs: building and checking them, their dict form, and the command-line parsers."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.core.demand import Demand
from apportion.core.resources import SCALE, from_ticks
from apportion.runs.spec import (
    MAX_ARRAY_INDEX,
    MAX_ARRAY_SIZE,
    RunResources,
    RunSpec,
    expand_array,
    format_array,
    format_time_limit,
    new_spec,
    parse_array,
    parse_run_resources,
    parse_time_limit,
)


def spec(**overrides: Any) -> RunSpec:
    args: dict[str, Any] = {"cwd": "/work", "env": {"HOME": "/home/u"}}
    args.update(overrides)
    command = args.pop("command", ["python", "train.py"])
    return new_spec(command, **args)


# --- new_spec -----------------------------------------------------------------------


def test_new_spec_captures_cwd_and_environment_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPORTION_TEST_VAR", "before")
    made = new_spec(["true"])
    monkeypatch.setenv("APPORTION_TEST_VAR", "after")
    assert made.cwd == os.getcwd()
    assert made.env["APPORTION_TEST_VAR"] == "before"
    assert made.command == ("true",)
    assert (made.resources, from_ticks(made.demand.first), made.name, made.priority) == (
        "",
        {},
        "",
        0,
    )
    assert (made.retries, made.time_limit, made.array_index) == (0, None, None)


def test_new_spec_makes_a_relative_cwd_absolute() -> None:
    assert spec(cwd="sub").cwd == os.path.join(os.getcwd(), "sub")


def test_new_spec_merges_resource_texts() -> None:
    made = spec(resources=["foo=1", "baz=1 bar=0.5"])
    assert made.resources == "bar=0.5 baz=1 foo=1"
    assert from_ticks(made.demand.first) == {"bar": 0.5, "baz": 1.0, "foo": 1.0}
    assert spec(resources="gpu=2").resources == "gpu=2"


def test_a_command_given_as_one_string_is_refused() -> None:
    with pytest.raises(ValueError, match=r"list of arguments, not the string 'echo hi'.*shlex"):
        new_spec("echo hi")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"command": []}, "'command' must be a non-empty list"),
        ({"command": ["a", 1]}, "'command' must hold only UTF-8 strings"),
        ({"command": ["a\0b"]}, "'command' must hold only UTF-8 strings without NUL"),
        ({"env": {"A=B": "1"}}, "'env' must have UTF-8 variable names without '='"),
        ({"env": {"": "1"}}, "'env' must have UTF-8 variable names"),
        ({"env": {"A": 1}}, "'env' must have UTF-8 values .*variable 'A'"),
        ({"env": {"A": "\udcff"}}, "'env' must have UTF-8 values .*variable 'A'"),
        ({"command": ["ls", "caf\udce9"]}, "'command' must hold only UTF-8 strings"),
        ({"cwd": "/caf\udce9"}, "'cwd' must be an absolute path in UTF-8"),
        ({"name": "caf\udce9"}, "'name' must be UTF-8 text"),
        ({"retries": -1}, "'retries' must be between 0 and"),
        ({"retries": True}, "'retries' must be an integer"),
        ({"priority": 1.5}, "'priority' must be an integer"),
        ({"priority": 2**63}, "'priority' must be between"),
        ({"time_limit": 0}, "'time_limit' must be a positive number"),
        ({"time_limit": -5.0}, "'time_limit' must be a positive number"),
        ({"time_limit": math.inf}, "'time_limit' must be a positive number"),
        ({"time_limit": math.nan}, "'time_limit' must be a positive number"),
        ({"time_limit": "10m"}, "'time_limit' must be a positive number"),
        ({"name": "123"}, "'name' must be one printable line.*not all digits"),
        ({"name": "two\nlines"}, "'name' must be one printable line"),
        ({"name": " padded"}, "'name' must be one printable line"),
        ({"name": "x" * 201}, "at most 200 characters"),
        ({"resources": "foo"}, "^invalid resource spec 'foo'"),
    ],
)
def test_new_spec_refuses_bad_fields(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec(**overrides)


def test_specs_are_hashable_and_compare_by_value() -> None:
    assert spec() == spec()
    assert hash(spec()) == hash(spec())
    assert spec(name="a") != spec(name="b")


# --- to_dict / from_dict ------------------------------------------------------------


#: What argv and environment strings may hold: any UTF-8 text without NUL.
TEXT = st.characters(codec="utf-8", exclude_characters="\0")
names = st.one_of(
    st.just(""),
    st.text(st.characters(codec="ascii", categories=["L", "N", "P"]), min_size=1, max_size=20),
).filter(lambda n: not n.isdigit())
specs = st.builds(
    lambda command, env, resources, name, priority, retries, limit, preemptible: new_spec(
        command,
        cwd="/data/x",
        env=env,
        resources=resources,
        name=name,
        priority=priority,
        retries=retries,
        time_limit=limit,
        preemptible=preemptible,
    ),
    st.lists(st.text(TEXT), min_size=1, max_size=4),
    st.dictionaries(
        st.text(st.characters(codec="utf-8", exclude_characters="=\0"), min_size=1, max_size=8),
        st.text(TEXT, max_size=8),
        max_size=4,
    ),
    st.lists(st.sampled_from(["foo=1", "bar=0.5", "baz=16GiB", "gpu=2"]), unique=True),
    names,
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 100),
    st.none() | st.floats(min_value=0.001, max_value=1e9),
    st.booleans(),
)


@given(specs)
def test_to_dict_from_dict_round_trip_through_json_and_msgpack(made: RunSpec) -> None:
    assert RunSpec.from_dict(made.to_dict()) == made
    assert RunSpec.from_dict(json.loads(json.dumps(made.to_dict()))) == made
    packed = msgpack.packb(made.to_dict(), use_bin_type=True)
    assert RunSpec.from_dict(msgpack.unpackb(packed, raw=False)) == made


def test_from_dict_fills_in_defaults_and_derives_demand() -> None:
    made = RunSpec.from_dict({"command": ["a"], "cwd": "/", "env": {}, "resources": "x=2"})
    assert made == RunSpec(("a",), "/", {}, "x=2", Demand(({"x": 2 * SCALE},)))


def test_a_spec_that_is_not_preemptible_is_stored_as_before() -> None:
    assert "preemptible" not in spec().to_dict()
    assert spec(preemptible=True).to_dict()["preemptible"] is True


def test_from_dict_normalises_resource_text() -> None:
    d = spec().to_dict() | {"resources": "foo=1,bar=2", "demand": {"foo": 1, "bar": 2}}
    assert RunSpec.from_dict(d).resources == "bar=2 foo=1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"demand": {"foo": 2.0}}, "'demand' must match resources 'foo=1'"),
        ({"demand": {"foo": "1"}}, "'demand' must be a mapping of names to numbers"),
        ({"cwd": "relative/dir"}, "'cwd' must be an absolute path"),
        ({"cwd": "/a\0b"}, "'cwd' must be an absolute path"),
        ({"cwd": None}, "'cwd' must be an absolute path"),
        ({"command": "ls"}, "'command' must be a non-empty list"),
        ({"env": [("A", "1")]}, "'env' must be a mapping"),
        ({"array_index": -1}, "'array_index' must be between 0 and"),
        ({"name": 7}, "'name' must be a string"),
        ({"resources": 5}, "'resources' must be text"),
        ({"colour": "red"}, "unknown field.*colour"),
        ({"preemptible": 1}, "'preemptible' must be true or false"),
    ],
)
def test_from_dict_names_the_bad_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunSpec.from_dict(spec(resources="foo=1").to_dict() | change)


def test_from_dict_refuses_missing_fields_and_non_mappings() -> None:
    with pytest.raises(ValueError, match=r"missing field.*cwd, env"):
        RunSpec.from_dict({"command": ["a"], "resources": ""})
    with pytest.raises(ValueError, match="must be a mapping, not list"):
        RunSpec.from_dict([])  # type: ignore[arg-type]


def test_a_huge_bad_value_is_cut_short_in_the_message() -> None:
    with pytest.raises(ValueError) as info:
        RunSpec.from_dict(spec().to_dict() | {"cwd": "x" * 10_000})
    assert len(str(info.value)) < 200


# --- parse_run_resources ------------------------------------------------------------


def in_units(parsed: RunResources) -> tuple[str, dict[str, float]]:
    """The text and the amounts in plain numbers."""
    return parsed.text, from_ticks(parsed.demand.first)


def test_resource_texts_merge_sorted() -> None:
    assert in_units(parse_run_resources(["foo=1", "bar=1 baz=1"])) == (
        "bar=1 baz=1 foo=1",
        {"bar": 1.0, "baz": 1.0, "foo": 1.0},
    )


def test_no_resources() -> None:
    assert in_units(parse_run_resources([])) == ("", {})
    assert in_units(parse_run_resources(["", "  "])) == ("", {})
    assert in_units(parse_run_resources("")) == ("", {})


def test_resource_amounts_are_rendered_exactly_and_zeros_dropped() -> None:
    assert in_units(parse_run_resources(["mem=16GiB gpu=0.5 lic=0"])) == (
        "gpu=0.5 mem=17179869184",
        {"gpu": 0.5, "mem": 17179869184.0},
    )


def test_a_name_in_two_texts_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'foo' is given twice \(in 'foo=1' and 'bar=1 foo=2'\)"):
        parse_run_resources(["foo=1", "bar=1 foo=2"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("foo", "invalid resource spec 'foo': parts must be NAME=AMOUNT"),
        ("gpu=[0,1]", "asks for an amount"),
        ("foo=-1", "must not be negative"),
        ("foo=1 foo=2", "given twice"),
    ],
)
def test_invalid_resource_texts_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_run_resources(["ok=1", text])


# --- arrays -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "indices"),
    [
        ("1-5", [1, 2, 3, 4, 5]),
        ("0-9", list(range(10))),
        ("1,3,5", [1, 3, 5]),
        ("1-3,7,10-12", [1, 2, 3, 7, 10, 11, 12]),
        ("0-10:2", [0, 2, 4, 6, 8, 10]),
        ("0-9:4", [0, 4, 8]),
        (" 7 , 1-2 ", [7, 1, 2]),
        ("4", [4]),
        ("5-5", [5]),
    ],
)
def test_parse_array(text: str, indices: list[int]) -> None:
    assert parse_array(text) == indices


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "invalid array '': give indices"),
        ("  ", "give indices"),
        ("-3", "indices must not be negative"),
        ("-1-4", "indices must not be negative"),
        ("5-1", "range '5-1' runs backwards"),
        ("1-3,2", "index 2 is given twice"),
        ("1,,2", "an empty part"),
        ("1.5", "'1.5' is not an index or a range"),
        ("a-b", "'a-b' is not an index or a range"),
        ("1-4:0", "the step in '1-4:0' must be positive"),
        ("0-100000", "more than 100,000 elements"),
        ("0-99999,200000-200001", "more than 100,000 elements"),
        ("0-9999999999", "numbers go up to 2147483647"),
        ("1" * 5000, "numbers go up to"),
        ("1-2:" + "9" * 5000, "numbers go up to"),
        ("١٢", "not an index"),
    ],
)
def test_parse_array_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_array(text)


def test_the_largest_array_is_allowed() -> None:
    assert len(parse_array(f"0-{MAX_ARRAY_SIZE - 1}")) == MAX_ARRAY_SIZE
    assert parse_array(str(MAX_ARRAY_INDEX)) == [MAX_ARRAY_INDEX]


@given(st.lists(st.integers(0, MAX_ARRAY_INDEX), min_size=1, max_size=50, unique=True))
def test_format_array_round_trips(indices: list[int]) -> None:
    assert parse_array(format_array(indices)) == indices


@given(st.integers(0, 1000), st.integers(0, 50), st.integers(1, 7))
def test_stepped_ranges_match_python_ranges(low: int, length: int, step: int) -> None:
    assert parse_array(f"{low}-{low + length}:{step}") == list(range(low, low + length + 1, step))


def test_format_array_compresses_runs() -> None:
    assert format_array([1, 2, 3, 7, 10, 11]) == "1-3,7,10,11"
    assert format_array([]) == ""


def test_expand_array_fills_in_every_placeholder() -> None:
    base = spec(command=["train", "--seed={}", "out/{}/{}.txt", "plain"], name="sweep")
    runs = expand_array(base, [3, 10])
    assert [r.command for r in runs] == [
        ("train", "--seed=3", "out/3/3.txt", "plain"),
        ("train", "--seed=10", "out/10/10.txt", "plain"),
    ]
    assert [r.array_index for r in runs] == [3, 10]
    assert all(r.name == "sweep" and r.env is base.env for r in runs)


def test_expand_array_without_placeholder_only_sets_the_index() -> None:
    runs = expand_array(spec(), parse_array("0-2"))
    assert [(r.command, r.array_index) for r in runs] == [(spec().command, i) for i in range(3)]


def test_expand_array_refuses_bad_indices() -> None:
    with pytest.raises(ValueError, match="distinct"):
        expand_array(spec(), [1, 1])
    with pytest.raises(ValueError, match="'array_index' must be between 0"):
        expand_array(spec(), [-1])
    with pytest.raises(ValueError, match="already element 1 of an array"):
        expand_array(expand_array(spec(), [1])[0], [2])
    assert expand_array(spec(), []) == []


# --- time limits --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("0.5", 0.5),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1.5h", 5400.0),
        ("1d2h3m4s", 93784.0),
        (" 10M ", 600.0),
    ],
)
def test_parse_time_limit(text: str, seconds: float) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "give seconds or d/h/m/s"),
        ("abc", "give seconds or d/h/m/s"),
        ("10x", "give seconds or d/h/m/s"),
        ("30m1h", "give seconds or d/h/m/s"),
        ("1h1h", "give seconds or d/h/m/s"),
        ("-5", "give seconds or d/h/m/s"),
        ("inf", "give seconds or d/h/m/s"),
        ("1e3", "give seconds or d/h/m/s"),
        ("0", "must be positive"),
        ("0h0m", "must be positive"),
        ("9" * 400, "finite"),
    ],
)
def test_parse_time_limit_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"invalid time limit .*{message}"):
        parse_time_limit(text)


@given(st.integers(1, 10 * 365 * 86400) | st.floats(min_value=1e-9, max_value=1e6, allow_nan=False))
def test_format_time_limit_round_trips(seconds: float) -> None:
    assert parse_time_limit(format_time_limit(seconds)) == seconds


def test_format_time_limit_reads_naturally() -> None:
    assert [format_time_limit(s) for s in (5400, 90, 86400, 1.5, 3601)] == [
        "1h30m",
        "1m30s",
        "1d",
        "1.5s",
        "1h1s",
    ]


def test_a_spec_names_its_person_only_when_a_person_submitted_it() -> None:
    owner = new_spec(["true"], cwd="/", env={})
    assert "person" not in owner.to_dict()  # an owner's spec stays as it always was
    alice = replace(owner, person="alice")
    assert RunSpec.from_dict(alice.to_dict()) == alice
    with pytest.raises(ValueError, match="run spec field 'person' invalid person name 'Al ice'"):
        RunSpec.from_dict({**owner.to_dict(), "person": "Al ice"})
