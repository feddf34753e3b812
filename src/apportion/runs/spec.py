"""What a run is: the command, where and with what environment it runs, what it needs.

A ``RunSpec`` is captured when the user submits (``cwd`` and the whole environment
then, not when a worker gets round to it: the run must behave as if started from the
user's shell). It travels as a plain dict (``to_dict``/``from_dict``) in messages and
in the journal, and ``from_dict`` checks every field, because a spec may come from
another process or an older file and a bad field is better refused at the door than
found when the run starts an hour later.

The parsers here turn command-line texts (``--resources``, ``--array``,
``--time-limit``) into values; each raises ``ValueError`` quoting what it was given.

A run's resources are parsed once where they enter (the command line, a submitted
dict, a journal row) into its ``Demand``, which the job queue hands to the scheduler
as it is; the normalised text beside it is what people read and what is stored.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import lru_cache
from typing import Any, NamedTuple, TypeGuard

from apportion.core.demand import PLAIN, Demand
from apportion.core.people import check_person_name
from apportion.core.resources import format_resources, from_ticks, parse_demand

#: Most elements one array may have: beyond this a typo (``1-1000000``) is likelier
#: than a wish, and every element is a row in the journal.
MAX_ARRAY_SIZE = 100_000

#: Largest array index: indices are exported as environment variables and stored as
#: SQLite integers, and no sensible array numbers its elements beyond this.
MAX_ARRAY_INDEX = 2**31 - 1

#: Integers are stored as SQLite's signed 64-bit integers.
_INT64 = 2**63

_MAX_NAME = 200


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One shell-command run as submitted; immutable.

    Build one with ``new_spec`` or ``from_dict``, which validate; the constructor
    trusts its arguments (the journal rebuilds thousands of its own specs at once).
    The dicts are shared, never copied (an array's elements share one environment),
    so they must not be mutated.
    """

    #: The argv; non-empty, no NUL bytes. Run without a shell.
    command: tuple[str, ...]
    #: Absolute working directory, as it was when the run was submitted.
    cwd: str
    #: The whole environment, as it was when the run was submitted.
    env: dict[str, str] = field(hash=False)
    #: Normalised resource text shown to users and stored, names sorted
    #: (``"bar=1 foo=0.5"``); ``""`` for none. ``demand`` says the same in ticks.
    resources: str
    #: What the run asks for, parsed from ``resources`` once, where the spec entered;
    #: zero amounts are left out. Not in ``to_dict``: the text says it.
    demand: Demand = field(hash=False)
    #: Optional label for people; one printable line, never all digits (not an id).
    name: str = ""
    #: Higher starts earlier among runs that could start.
    priority: int = 0
    #: How many times the run is started again after a failed exit; >= 0.
    retries: int = 0
    #: Seconds a run may take before it is stopped; positive, or None for no limit.
    time_limit: float | None = None
    #: Index within its array (``--array``), or None for a lone run.
    array_index: int | None = None
    #: Who submitted it: a person the owner admitted, or "" for the owner. Set by the
    #: job queue from who asked (``ForwardedRequest.person``), never by the submitter.
    person: str = ""
    #: The scheduler may stop it (SIGTERM, the grace, SIGKILL) and start it again
    #: later, as a new attempt, to let in a share kept below its fair share
    #: (``apportion scheduler --preempt-after``); not a failure, no retry used.
    preemptible: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON- and msgpack-friendly values (the argv as a list)."""
        return {
            "command": list(self.command),
            "cwd": self.cwd,
            "env": self.env,
            "resources": self.resources,
            "name": self.name,
            "priority": self.priority,
            "retries": self.retries,
            "time_limit": self.time_limit,
            "array_index": self.array_index,
            # Only when set: an owner's spec stays as it always was.
            **({"person": self.person} if self.person else {}),
            **({"preemptible": True} if self.preemptible else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSpec:
        """Check every field of ``d`` and build the spec; ``ValueError`` names a bad field.

        ``demand`` (the resources in numbers, ``{"foo": 0.5}``, as older versions sent
        and stored it) may be left out, since it follows from ``resources``; if given
        it must agree, since a run scheduled by one and shown by the other would
        mislead.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a run spec must be a mapping, not {type(d).__name__}")
        unknown = sorted(str(k) for k in d if k not in _FIELDS)
        if unknown:
            raise ValueError(f"run spec has unknown field(s) {', '.join(unknown)}")
        absent = [name for name in _REQUIRED if name not in d]
        if absent:
            raise ValueError(f"run spec is missing field(s) {', '.join(absent)}")
        resources, demand = _resources(d["resources"])
        if "demand" in d and _demand(d["demand"]) != from_ticks(demand.first):
            raise _bad("demand", f"must match resources {resources!r}", d["demand"])
        return cls._checked(d, resources, demand)

    @classmethod
    def _checked(cls, d: Mapping[str, Any], resources: str, demand: Demand) -> RunSpec:
        """The spec of ``d``, every field but the resources (given parsed) checked."""
        return cls(
            command=_command(d["command"]),
            cwd=_cwd(d["cwd"]),
            env=_env(d["env"]),
            resources=resources,
            demand=demand,
            name=_name(d.get("name", "")),
            priority=_int("priority", d.get("priority", 0), -_INT64, _INT64 - 1),
            retries=_int("retries", d.get("retries", 0), 0, _INT64 - 1),
            time_limit=_time_limit(d.get("time_limit")),
            array_index=_array_index(d.get("array_index")),
            person=_person(d.get("person", "")),
            preemptible=_flag("preemptible", d.get("preemptible", False)),
        )


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, "must be true or false", value)
    return value


def _person(value: object) -> str:
    """Who submitted the run: "" (the owner) or a person's name."""
    if value == "":
        return ""
    try:
        return check_person_name(value)
    except ValueError as exc:
        raise _bad("person", str(exc), value) from None


_REQUIRED = ("command", "cwd", "env", "resources")
_FIELDS = frozenset(RunSpec.__dataclass_fields__)


def new_spec(
    command: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    resources: str | Sequence[str] | RunResources = (),
    name: str = "",
    priority: int = 0,
    retries: int = 0,
    time_limit: float | None = None,
    preemptible: bool = False,
) -> RunSpec:
    """A validated spec; ``cwd`` and ``env`` default to this process's, captured now.

    ``preemptible``: the scheduler may stop the run and start it again later to let
    another share in (``RunSpec.preemptible``).

    ``resources`` is one ``--resources`` text or several (see ``parse_run_resources``),
    or what that returned (a caller that checked them first: they are not parsed
    again). A relative ``cwd`` is taken relative to the current directory.
    """
    if isinstance(command, str):
        raise ValueError(
            f"command must be a list of arguments, not the string {command!r} "
            "(shlex.split it, or run ['sh', '-c', ...])"
        )
    parsed = resources if isinstance(resources, RunResources) else parse_run_resources(resources)
    return RunSpec._checked(
        {
            "command": list(command),
            "cwd": os.getcwd() if cwd is None else os.path.abspath(cwd),
            "env": dict(os.environ if env is None else env),
            "name": name,
            "priority": priority,
            "retries": retries,
            "time_limit": time_limit,
            "preemptible": preemptible,
        },
        parsed.text,
        parsed.demand,
    )


# --- command-line texts ---------------------------------------------------------------


class RunResources(NamedTuple):
    """A run's ``--resources`` parsed: the normalised text and the ``Demand``."""

    text: str
    demand: Demand


def parse_run_resources(texts: str | Sequence[str]) -> RunResources:
    """Merge several ``--resources`` texts into normalised text and a demand in ticks.

    A user may give the option several times (``["foo=1", "bar=1 baz=1"]``), as
    Guild runs carry several tags; a name given in two of them is an error rather
    than a silent last-one-wins. A single string is taken as one text.

    >>> parse_run_resources(["foo=1", "bar=0.5"])
    RunResources(text='bar=0.5 foo=1', demand=Demand([{'bar': 5000, 'foo': 10000}]))
    """
    if isinstance(texts, str):
        texts = [texts]
    merged: dict[str, int] = {}
    given_in: dict[str, str] = {}
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"resources must be text like 'foo=1', not {text!r}")
        for name, ticks in parse_demand(text).items():
            if name in merged:
                raise ValueError(
                    f"resource {name!r} is given twice (in {given_in[name]!r} and {text!r})"
                )
            merged[name] = ticks
            given_in[name] = text
    amounts = dict(sorted(merged.items()))
    return RunResources(format_resources(amounts), Demand((amounts,)) if amounts else PLAIN)


@lru_cache(maxsize=4096)
def stored_demand(text: str) -> Demand:
    """The demand of a normalised resource text this program stored (a journal row).

    Trusted, so not checked as ``from_dict`` checks; cached, as the runs of an array
    and of a sweep share their text: each distinct text is parsed once.
    """
    return parse_run_resources(text).demand


_ARRAY_PART = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_ARRAY_HELP = "(examples: 1-20, 1,3,5, 1-3,7,10-12, 0-10:2)"


def parse_array(text: str) -> list[int]:
    """Indices of an ``--array``: ``"1-20"``, ``"1,3,5"``, ``"1-3,7,10-12"``, ``"0-10:2"``.

    Indices come in the order given. Duplicates, backward ranges and more than
    ``MAX_ARRAY_SIZE`` elements are refused before any list is built, so a typo such
    as ``1-10000000000`` fails at once instead of filling memory.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"invalid array {text!r}: give indices {_ARRAY_HELP}")
    spans: list[range] = []
    size = 0
    for raw in text.split(","):
        span = _array_span(text, raw.strip())
        size += len(span)
        if size > MAX_ARRAY_SIZE:
            raise ValueError(f"invalid array {text!r}: more than {MAX_ARRAY_SIZE:,} elements")
        spans.append(span)
    indices = [i for span in spans for i in span]
    seen: set[int] = set()
    for index in indices:
        if index in seen:
            raise ValueError(f"invalid array {text!r}: index {index} is given twice")
        seen.add(index)
    return indices


def _array_span(text: str, part: str) -> range:
    """One comma-separated part of an array text as a range."""
    match = _ARRAY_PART.fullmatch(part)
    if match is None:
        if not part:
            why = "an empty part"
        elif re.fullmatch(r"-[0-9]+(-.*)?", part):
            why = "indices must not be negative"
        else:
            why = f"{part!r} is not an index or a range"
        raise ValueError(f"invalid array {text!r}: {why} {_ARRAY_HELP}")
    low_text, high_text, step_text = match.groups()
    # Length first: int() of thousands of digits is slow, then refused unclearly.
    if any(len(t) > len(str(MAX_ARRAY_INDEX)) for t in match.groups() if t):
        raise ValueError(f"invalid array {text!r}: numbers go up to {MAX_ARRAY_INDEX}")
    low = int(low_text)
    high = int(high_text) if high_text else low
    step = int(step_text) if step_text else 1
    if max(low, high, step) > MAX_ARRAY_INDEX:
        raise ValueError(f"invalid array {text!r}: numbers go up to {MAX_ARRAY_INDEX}")
    if high < low:
        raise ValueError(f"invalid array {text!r}: range {part!r} runs backwards")
    if step == 0:
        raise ValueError(f"invalid array {text!r}: the step in {part!r} must be positive")
    return range(low, high + 1, step)


def format_array(indices: Sequence[int]) -> str:
    """Short text for indices, the inverse of ``parse_array``: ``[1, 2, 3, 7]`` -> ``"1-3,7"``."""
    parts: list[str] = []
    i = 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{indices[i]}-{indices[j]}")
        else:
            parts.extend(str(n) for n in indices[i : j + 1])
        i = j + 1
    return ",".join(parts)


_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_DURATION = re.compile(
    rf"(?:(?P<d>{_NUMBER})d)?\s*(?:(?P<h>{_NUMBER})h)?\s*"
    rf"(?:(?P<m>{_NUMBER})m)?\s*(?:(?P<s>{_NUMBER})s)?",
    re.IGNORECASE,
)
_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def parse_time_limit(text: str) -> float:
    """Seconds from ``"90"``, ``"90s"``, ``"10m"``, ``"1h30m"``, ``"1.5h"`` or ``"1d"``.

    Units go from days down to seconds, each at most once, so ``"30m1h"`` (likely a
    slip) is refused rather than added up.
    """
    stripped = text.strip() if isinstance(text, str) else ""
    seconds: float | None = None
    if re.fullmatch(_NUMBER, stripped):
        seconds = float(stripped)
    elif stripped and (match := _DURATION.fullmatch(stripped)):
        seconds = sum(
            float(value) * _SECONDS[unit] for unit, value in match.groupdict().items() if value
        )
    if seconds is None:
        raise ValueError(
            f"invalid time limit {text!r}: give seconds or d/h/m/s "
            "(examples: 90, 90s, 10m, 1h30m, 1.5h, 1d)"
        )
    if not 0 < seconds < math.inf:
        raise ValueError(f"invalid time limit {text!r}: it must be positive and finite")
    return seconds


def format_time_limit(seconds: float) -> str:
    """Exact text for seconds, the inverse of ``parse_time_limit``: 5400 -> ``"1h30m"``."""
    if seconds != int(seconds):
        # Plain decimals, never exponents (1e-07), which parse_time_limit refuses.
        return f"{Decimal(repr(float(seconds))):f}s"
    rest = int(seconds)
    parts: list[str] = []
    for unit, size in _SECONDS.items():
        count, rest = divmod(rest, int(size))
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def expand_array(spec: RunSpec, indices: Sequence[int]) -> list[RunSpec]:
    """One spec per index: every ``{}`` in the argv replaced by it, ``array_index`` set.

    A command without ``{}`` is allowed: the runner exports the index as
    ``APPORTION_ARRAY_INDEX``, which a script may read instead.
    """
    if spec.array_index is not None:
        raise ValueError(f"run spec is already element {spec.array_index} of an array")
    if len(indices) > MAX_ARRAY_SIZE:
        raise ValueError(f"an array has at most {MAX_ARRAY_SIZE:,} elements, not {len(indices)}")
    checked = [_array_index(i) for i in indices]
    if len(set(checked)) != len(checked):
        raise ValueError("array indices must be distinct")
    return [
        replace(
            spec,
            command=tuple(arg.replace("{}", str(index)) for arg in spec.command),
            array_index=index,
        )
        for index in checked
    ]


# --- field checks -------------------------------------------------------------------


def _bad(name: str, must: str, value: object) -> ValueError:
    """An error naming the field; long values (a whole environment) are cut short."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ValueError(f"run spec field {name!r} {must}, got {shown}")


def _text(value: object) -> TypeGuard[str]:
    """True for a str that can be a C string and travel as UTF-8 (msgpack, SQLite).

    Undecodable bytes in argv or the environment reach Python as lone surrogates
    (``"\\udcff"``); they are refused here, naming the field, rather than failing later
    with a ``UnicodeEncodeError`` deep in the wire layer.
    """
    if not isinstance(value, str) or "\0" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _command(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise _bad("command", "must be a non-empty list of strings", value)
    for arg in value:
        if not _text(arg):
            raise _bad("command", "must hold only UTF-8 strings without NUL bytes", arg)
    return tuple(value)


def _cwd(value: object) -> str:
    if not _text(value) or not os.path.isabs(value):
        raise _bad("cwd", "must be an absolute path in UTF-8", value)
    return value


def _env(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _bad("env", "must be a mapping of strings to strings", value)
    for key, item in value.items():
        if not _text(key) or not key or "=" in key:
            raise _bad("env", "must have UTF-8 variable names without '=' or NUL", key)
        if not _text(item):
            raise _bad("env", f"must have UTF-8 values without NUL (variable {key!r})", item)
    return value


def _resources(value: object) -> RunResources:
    if not isinstance(value, str):
        raise _bad("resources", "must be text like 'foo=1 bar=0.5'", value)
    try:
        return parse_run_resources([value])
    except ValueError as error:
        raise ValueError(f"run spec field 'resources': {error}") from None


def _demand(value: object) -> dict[str, float]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in value.items()
    ):
        raise _bad("demand", "must be a mapping of names to numbers", value)
    return {k: float(v) for k, v in value.items()}


def _name(value: object) -> str:
    if not isinstance(value, str):
        raise _bad("name", "must be a string", value)
    if not _text(value):
        raise _bad("name", "must be UTF-8 text", value)
    if value and (
        len(value) > _MAX_NAME
        or not value.isprintable()
        or value != value.strip()
        or value.isdigit()
    ):
        raise _bad(
            "name",
            f"must be one printable line of at most {_MAX_NAME} characters, "
            "not all digits (those are run ids)",
            value,
        )
    return value


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, "must be an integer", value)
    if not low <= value <= high:
        raise _bad(name, f"must be between {low} and {high}", value)
    return value


def _time_limit(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise _bad("time_limit", "must be a positive number of seconds or None", value)
    return float(value)


def _array_index(value: object) -> int | None:
    if value is None:
        return None
    return _int("array_index", value, 0, MAX_ARRAY_INDEX)
