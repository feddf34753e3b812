"""Resource specs and fixed-point amounts (the ledger itself: ``core.ledger``).

Theory of operation
-------------------
A *supply* says what a worker process offers (``GPU=2 MEMORY=100e9``); a *demand*
says what a task needs while it runs (``{"GPU": 1}``). Both are parsed here into
``dict[str, int]`` in fixed point: an amount of 1 is ``SCALE`` ticks, so ``0.5`` GPU is
5,000 ticks and ``100e9`` bytes is an exact integer. Integer ticks mean that taking
and returning the same amounts always restores the ledger exactly: floats would
drift after a few thousand fractional tasks and a pool would end up "almost" free.

One syntax everywhere: ``NAME=AMOUNT`` pairs separated by spaces or commas, or a
mapping ``{NAME: AMOUNT}`` from Python. Amounts are non-negative numbers
(``2``, ``0.5``, ``100e9``) optionally with a size suffix (``16GiB``, ``500MB``, ``2k``).
Anything else is a ``ValueError`` that quotes the offending part.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

#: Ticks in an amount of 1 of any resource. 10**4 keeps 1 TiB of memory (1.1e16 ticks)
#: inside a signed 64-bit integer on the wire and allows requests down to 0.0001.
SCALE = 10_000

#: Amounts travel as signed 64-bit integers; an amount of 9.2e14 is beyond any real pool.
MAX_TICKS = 2**63 - 1

Amounts = dict[str, int]
"""A supply or demand in ticks, keyed by resource name. Never holds a negative value."""

Units = dict[str, list[str]]
"""Indexed pools: name -> unit labels in order (``{"gpu": ["0", "1"]}``)."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")

_SUFFIXES: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "p": 10**15,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_AMOUNT = re.compile(r"^([0-9.eE+\-]+?)\s*([A-Za-z]*)$")

ResourceSpec = str | Mapping[str, float | int | str | Sequence[int | str] | range] | None
"""What users may pass wherever resources are asked for."""


def parse_amount(text: str | float | int, *, name: str = "?") -> int:
    """Parse one amount (``2``, ``0.5``, ``100e9``, ``16GiB``) into ticks.

    Raises ``ValueError`` for negatives, non-numbers, NaN and infinities.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"resource {name!r}: amount must be a number, not {text!r}")
    if isinstance(text, int | float):
        if not math.isfinite(text):
            raise ValueError(f"resource {name!r}: amount must be finite, got {text!r}")
        value = Decimal(repr(text)) if isinstance(text, float) else Decimal(text)
    else:
        match = _AMOUNT.match(text.strip())
        suffix = match.group(2).lower() if match else ""
        if match is None or suffix not in _SUFFIXES:
            raise ValueError(
                f"resource {name!r}: amount {text!r} is not a number "
                "(examples: 2, 0.5, 100e9, 16GiB)"
            )
        try:
            number = Decimal(match.group(1))
        except InvalidOperation:
            raise ValueError(
                f"resource {name!r}: amount {text!r} is not a number "
                "(examples: 2, 0.5, 100e9, 16GiB)"
            ) from None
        if not number.is_finite():
            raise ValueError(f"resource {name!r}: amount must be finite, got {text!r}")
        # Checked before any arithmetic: 1e999999999 would overflow Decimal's context
        # (an exception that is not a ValueError) and 1e-999999999 would round to 0.
        if number and number.adjusted() > 30:
            raise ValueError(f"resource {name!r}: amount {text!r} is too large")
        if number and number.adjusted() < -30:
            raise ValueError(f"resource {name!r}: amount {text!r} is below the smallest unit 1e-4")
        value = number * _SUFFIXES[suffix]
    if value < 0:
        raise ValueError(f"resource {name!r}: amount must not be negative, got {text!r}")
    ticks = int((value * SCALE).to_integral_value())
    if ticks > MAX_TICKS:
        raise ValueError(f"resource {name!r}: amount {text!r} is too large")
    if value > 0 and ticks == 0:
        raise ValueError(f"resource {name!r}: amount {text!r} is below the smallest unit 1e-4")
    return ticks


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid resource name, else raise ``ValueError``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"invalid resource name {name!r}: use letters, digits, '_', '-' or '.', "
            "starting with a letter or '_'"
        )
    return name


_SEPARATORS = " \t\n,"


def _pairs(spec: str) -> Iterator[tuple[str, str]]:
    """``NAME=AMOUNT`` parts separated by spaces or commas; ``NAME=[...]`` keeps its commas."""
    i, n = 0, len(spec)
    while i < n:
        if spec[i] in _SEPARATORS:
            i += 1
            continue
        start = i
        while i < n and spec[i] not in "=" + _SEPARATORS:
            i += 1
        name = spec[start:i]
        if i >= n or spec[i] != "=":
            raise ValueError(f"invalid resource spec {name!r}: parts must be NAME=AMOUNT")
        i += 1
        value_start = i
        if i < n and spec[i] == "[":
            end = spec.find("]", i)
            if end < 0:
                raise ValueError(f"invalid resource spec {spec[start:]!r}: missing ']'")
            i = end + 1
        else:
            while i < n and spec[i] not in _SEPARATORS:
                i += 1
        value = spec[value_start:i]
        part = spec[start:i]
        if not name:
            raise ValueError(f"invalid resource spec {part!r}: missing name before '='")
        if not value:
            raise ValueError(f"invalid resource spec {part!r}: missing amount after '='")
        yield name, value


_LABEL = re.compile(r"^[A-Za-z0-9_.:\-]+$")
_RANGE = re.compile(r"^(\d+)-(\d+)$")
#: Digits and dashes that are not a range (``0-``, ``-3``, ``0--3``): a range typed
#: wrong, refused rather than taken as one unit with that label.
_BROKEN_RANGE = re.compile(r"^[\d\-]*-[\d\-]*$")

#: Most units one indexed pool may have: ``[0-99999999]`` is a typo, not a pool.
MAX_UNITS = 65_536


def parse_units(value: str | Iterable[object], *, name: str = "?") -> list[str]:
    """Unit labels of an indexed pool: ``"[0,1,2,3]"``, ``"[0-7]"``, ``"[0-3,6]"``, ``[0, 1]``.

    Labels are kept as text (``"2"``, or a device UUID); ranges expand to numbers.
    """
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")):
            raise ValueError(f"resource {name!r}: units must be in brackets, like [0,1,2,3]")
        parts = [p.strip() for p in text[1:-1].split(",")] if text[1:-1].strip() else []
    else:
        parts = [str(p) for p in value]
    labels: list[str] = []
    for part in parts:
        span = _RANGE.match(part)
        if span:
            low, high = int(span.group(1)), int(span.group(2))
            if high < low:
                raise ValueError(f"resource {name!r}: range {part!r} runs backwards")
            if high - low + 1 + len(labels) > MAX_UNITS:
                raise ValueError(f"resource {name!r}: more than {MAX_UNITS} units in {part!r}")
            labels.extend(str(i) for i in range(low, high + 1))
        elif _BROKEN_RANGE.match(part):
            raise ValueError(
                f"resource {name!r}: {part!r} is not a range: write FIRST-LAST, like 0-3"
            )
        elif _LABEL.match(part):
            labels.append(part)
        else:
            raise ValueError(f"resource {name!r}: {part!r} is not a unit label")
    if not labels:
        raise ValueError(f"resource {name!r}: an indexed pool needs at least one unit")
    if len(labels) > MAX_UNITS:
        raise ValueError(f"resource {name!r}: more than {MAX_UNITS} units")
    if len(set(labels)) != len(labels):
        raise ValueError(f"resource {name!r}: a unit is listed twice in {value!r}")
    return labels


def _is_units(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().startswith("[")
    return isinstance(value, list | tuple | range)


def _items(spec: ResourceSpec) -> Iterable[tuple[object, Any]]:
    if isinstance(spec, str):
        return _pairs(spec)
    if isinstance(spec, Mapping):
        return spec.items()
    raise ValueError(
        f"resources must be a 'NAME=AMOUNT ...' string or a mapping, not {type(spec).__name__}"
    )


def parse_supply(spec: ResourceSpec) -> tuple[Amounts, Units]:
    """What a worker offers: amounts for every pool, and unit labels for indexed pools.

    An indexed pool (``gpu=[0,1,2,3]``) counts as that many units in the amounts, so
    the ledger's arithmetic is the same for both kinds; ``units`` says which.

    >>> parse_supply("gpu=[0-1] MEMORY=16")
    ({'gpu': 20000, 'MEMORY': 160000}, {'gpu': ['0', '1']})
    """
    amounts: Amounts = {}
    units: Units = {}
    if spec is None:
        return amounts, units
    for raw_name, raw_value in _items(spec):
        name = check_name(raw_name)
        if name in amounts:
            raise ValueError(f"resource {name!r} is given twice")
        if _is_units(raw_value):
            units[name] = parse_units(raw_value, name=name)
            amounts[name] = len(units[name]) * SCALE
        else:
            amounts[name] = parse_amount(raw_value, name=name)
    return amounts, units


def parse_resources(spec: ResourceSpec) -> Amounts:
    """Parse a supply or demand into ticks (indexed pools count their units).

    Accepts ``"GPU=2 MEMORY=100e9"``, ``"GPU=2,MEMORY=16GiB"``, ``"gpu=[0,1]"``,
    ``{"GPU": 2}`` or None. A name given twice is an error: silently keeping one
    would hide a typo.

    >>> parse_resources("GPU=2 MEMORY=1.5k")
    {'GPU': 20000, 'MEMORY': 15000000}
    """
    return parse_supply(spec)[0]


def parse_demand(spec: ResourceSpec) -> Amounts:
    """Parse what a task needs; zero amounts are dropped since they constrain nothing.

    A task asks for an amount even of an indexed pool (``gpu=2``, ``gpu=0.5``); which
    units it gets is the scheduler's choice, so unit lists are refused here.
    """
    amounts, units = parse_supply(spec)
    if units:
        name = next(iter(units))
        raise ValueError(
            f"resource {name!r}: a task asks for an amount ({name}=2, {name}=0.5), "
            "not for particular units"
        )
    return {name: ticks for name, ticks in amounts.items() if ticks}


def format_amount(ticks: int) -> str:
    """Render ticks exactly: ``20000`` -> ``"2"``, ``5000`` -> ``"0.5"``.

    Exact rather than short, because the text is parsed again (a LocalCluster
    hands its workers their specs as text): ``16GiB`` must come back as 16GiB.
    """
    whole, frac = divmod(ticks, SCALE)
    if not frac:
        return str(whole)
    return f"{whole}.{frac:0{len(str(SCALE)) - 1}d}".rstrip("0")


def format_resources(
    amounts: Mapping[str, int], units: Mapping[str, list[str]] | None = None
) -> str:
    """Render a supply or demand in the spec syntax, names sorted: ``"GPU=2 gpu=[0,1]"``."""
    return _render(amounts, units, lambda _, ticks: format_amount(ticks))


def _render(
    amounts: Mapping[str, int],
    units: Mapping[str, list[str]] | None,
    amount_text: Callable[[str, int], str],
) -> str:
    units = units or {}
    return " ".join(
        f"{name}=[{','.join(units[name])}]"
        if name in units
        else f"{name}={amount_text(name, amounts[name])}"
        for name in sorted(amounts)
    )


_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def is_byte_pool(name: str) -> bool:
    """Whether a pool counts bytes, by its name: ``memory``/``mem`` (any case) or a name
    ending in ``_memory``/``_bytes``.

    The name is the only honest sign: an amount given as ``16GiB`` is stored as a
    plain number, and a large count of licences is not memory.
    """
    lowered = name.lower()
    return lowered in ("memory", "mem") or lowered.endswith(("_memory", "_bytes"))


def describe_amount(name: str, ticks: int) -> str:
    """An amount of pool ``name`` for people to read: ``93.1 GiB`` for a byte pool
    (``is_byte_pool``), else the exact number (``2``, ``0.5``).

    The one rule for every text a user reads (``apportion info``, ``why``, errors,
    logs); specs that are parsed again use ``format_resources``, which is exact.
    """
    if not is_byte_pool(name):
        return format_amount(ticks)
    value = ticks / SCALE
    unit = 0
    while unit < len(_BINARY_UNITS) - 1 and round(value, 1) >= 1024:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{format_amount(ticks)} B"
    text = f"{value:.1f}".removesuffix(".0")
    return f"{text} {_BINARY_UNITS[unit]}"


def describe_resources(
    amounts: Mapping[str, int], units: Mapping[str, list[str]] | None = None
) -> str:
    """A supply or demand for people to read: ``GPU=2 memory=93.1 GiB``, names sorted.

    Like ``format_resources`` but with ``describe_amount``; not meant to be parsed.
    """
    return _render(amounts, units, describe_amount)


def describe_spec(text: str) -> str:
    """A spec as ``format_resources`` wrote it (a run's resources in the journal, what
    it holds) for people to read: ``MEMORY=50000000000`` -> ``MEMORY=46.6 GiB``.

    The text is stored to be parsed again, so it is exact; only its display follows
    ``describe_amount``. A text that does not parse (a journal written by hand) is
    shown as it is: it is only displayed here, never acted on.
    """
    try:
        amounts, units = parse_supply(text)
    except ValueError:
        return text
    return describe_resources(amounts, units)


def from_ticks(amounts: Mapping[str, int]) -> dict[str, float]:
    """Ticks back to plain numbers (``5000`` -> ``0.5``), as Dask reports amounts in
    ``scheduler_info()``. Not to be confused with an indexed pool's units (``Units``)."""
    return {name: ticks / SCALE for name, ticks in amounts.items()}
