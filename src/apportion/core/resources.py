"""Resource specs and the fixed-point arithmetic of the ledger.

Theory of operation
-------------------
A *supply* says what a worker process offers (``GPU=2 MEMORY=100e9``); a *demand*
says what a task needs while it runs (``{"GPU": 1}``). Both are parsed here into
``dict[str, int]`` in fixed point: one unit is ``SCALE`` ticks, so ``0.5`` GPU is
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
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation

#: Ticks per unit of any resource. 10**4 keeps 1 TiB of memory (1.1e16 ticks)
#: inside a signed 64-bit integer on the wire and allows requests down to 0.0001.
SCALE = 10_000

#: Amounts travel as signed 64-bit integers; 9.2e14 units is beyond any real pool.
MAX_TICKS = 2**63 - 1

Amounts = dict[str, int]
"""A supply or demand in ticks, keyed by resource name. Never holds a negative value."""

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

ResourceSpec = str | Mapping[str, float | int | str] | None
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
            value = Decimal(match.group(1)) * _SUFFIXES[suffix]
        except InvalidOperation:
            raise ValueError(
                f"resource {name!r}: amount {text!r} is not a number "
                "(examples: 2, 0.5, 100e9, 16GiB)"
            ) from None
        if not value.is_finite():
            raise ValueError(f"resource {name!r}: amount must be finite, got {text!r}")
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


def _pairs(spec: str) -> Iterable[tuple[str, str]]:
    for part in spec.replace(",", " ").split():
        name, sep, amount = part.partition("=")
        if not sep:
            raise ValueError(f"invalid resource spec {part!r}: parts must be NAME=AMOUNT")
        if not name:
            raise ValueError(f"invalid resource spec {part!r}: missing name before '='")
        if not amount:
            raise ValueError(f"invalid resource spec {part!r}: missing amount after '='")
        yield name, amount


def parse_resources(spec: ResourceSpec) -> Amounts:
    """Parse a supply or demand into ticks.

    Accepts ``"GPU=2 MEMORY=100e9"``, ``"GPU=2,MEMORY=16GiB"``, ``{"GPU": 2}`` or None.
    A name given twice is an error: silently keeping one would hide a typo.

    >>> parse_resources("GPU=2 MEMORY=1.5k")
    {'GPU': 20000, 'MEMORY': 15000000}
    """
    if spec is None:
        return {}
    items: Iterable[tuple[object, str | float | int]]
    if isinstance(spec, str):
        items = _pairs(spec)
    elif isinstance(spec, Mapping):
        items = spec.items()
    else:
        raise ValueError(
            f"resources must be a 'NAME=AMOUNT ...' string or a mapping, not {type(spec).__name__}"
        )
    out: Amounts = {}
    for raw_name, raw_amount in items:
        name = check_name(raw_name)
        if name in out:
            raise ValueError(f"resource {name!r} is given twice")
        out[name] = parse_amount(raw_amount, name=name)
    return out


def parse_demand(spec: ResourceSpec) -> Amounts:
    """Parse what a task needs; zero amounts are dropped since they constrain nothing."""
    return {name: ticks for name, ticks in parse_resources(spec).items() if ticks}


def format_amount(ticks: int) -> str:
    """Render ticks exactly: ``20000`` -> ``"2"``, ``5000`` -> ``"0.5"``.

    Exact rather than short, because the text is parsed again (a LocalCluster
    hands its workers their specs as text): ``16GiB`` must come back as 16GiB.
    """
    whole, frac = divmod(ticks, SCALE)
    if not frac:
        return str(whole)
    return f"{whole}.{frac:0{len(str(SCALE)) - 1}d}".rstrip("0")


def format_resources(amounts: Mapping[str, int]) -> str:
    """Render amounts back into the spec syntax, names sorted: ``"GPU=2 MEMORY=1e+11"``."""
    return " ".join(f"{name}={format_amount(amounts[name])}" for name in sorted(amounts))


def to_units(amounts: Mapping[str, int]) -> dict[str, float]:
    """Amounts as plain numbers of units, as Dask reports them in ``scheduler_info()``."""
    return {name: ticks / SCALE for name, ticks in amounts.items()}


# --- ledger arithmetic -------------------------------------------------------------
# Kept as functions over plain dicts: they sit on the scheduler's hot path.


def fits(demand: Mapping[str, int], free: Mapping[str, int]) -> bool:
    """True if every amount in ``demand`` is available in ``free``."""
    for name, need in demand.items():
        if free.get(name, 0) < need:
            return False
    return True


def take(free: dict[str, int], demand: Mapping[str, int]) -> None:
    """Subtract ``demand`` from ``free``; the caller has checked that it ``fits``."""
    for name, need in demand.items():
        left = free[name] - need
        if left < 0:
            raise AssertionError(f"ledger over-committed on {name!r}")
        free[name] = left


def give_back(free: dict[str, int], demand: Mapping[str, int], total: Mapping[str, int]) -> None:
    """Return ``demand`` to ``free``; never above ``total``, which would mean a double release."""
    for name, need in demand.items():
        back = free[name] + need
        if back > total[name]:
            raise AssertionError(f"ledger released {name!r} twice")
        free[name] = back


def missing(demand: Mapping[str, int], supply: Mapping[str, int]) -> dict[str, int]:
    """The part of ``demand`` that ``supply`` (a total, not what is free) can never meet."""
    return {
        name: need - supply.get(name, 0)
        for name, need in demand.items()
        if supply.get(name, 0) < need
    }
