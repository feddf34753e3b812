"""People a cluster's owner admits: each a name, a weight and a quota.

The owner (whoever holds the cluster's secret) admits others with ``apportion user
add NAME``; each person then connects with a credential of their own and is one
*share* of the cluster: the fair division weighs shares by ``weight`` and never lets a
person hold more than ``quota`` of any resource. The owner is the person ``OWNER``
(the empty name): never listed, never removed, sees everything.

Pure: the rules for names, weights and quotas, and the plain-data form they travel
and are stored in. Every refusal is a ``ValueError`` of one line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from apportion.core.resources import Amounts, format_resources, parse_supply

#: The person of the cluster's secret: the owner.
OWNER = ""

#: A person's name: what ``apportion user add`` takes and what credentials carry.
_NAME = re.compile(r"^[a-z_][a-z0-9_.\-]{0,63}$")


def check_person_name(name: object) -> str:
    """``name`` if it may name a person, else ``ValueError`` saying what may."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"invalid person name {name!r}: use 1 to 64 lower-case letters, digits, "
            "'_', '-' or '.', starting with a letter or '_'"
        )
    return name


def check_weight(weight: object) -> float:
    """``weight`` as a float if it is a finite number above 0, else ``ValueError``."""
    try:
        value = float(weight)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"invalid weight {weight!r}: give a number above 0") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"invalid weight {weight!r}: give a number above 0")
    return value


def parse_quota(text: str) -> Amounts:
    """A quota spec (``"gpu=2 memory=200GiB"``, the syntax of ``--resources``) in ticks;
    ``""`` for none. Unit lists are refused: a quota caps amounts. A cap of 0 is
    kept (``gpu=0``: none at all), where a task's request of 0 asks for nothing."""
    try:
        amounts, units = parse_supply(text)
    except ValueError as exc:
        raise ValueError(f"invalid quota {text!r}: {exc}") from None
    if units:
        name = next(iter(units))
        raise ValueError(
            f"invalid quota {text!r}: resource {name!r}: a quota caps an amount "
            f"({name}=2), not particular units"
        )
    return amounts


@dataclass(frozen=True, slots=True)
class Person:
    """One admitted person: their share's weight and their hard caps."""

    name: str
    #: Their share's weight in the fair division (above 0; 1 by default).
    weight: float = 1.0
    #: At most this much of each named resource at once, in ticks; none named: no cap.
    quota: Amounts = field(default_factory=dict, hash=False)

    @property
    def quota_text(self) -> str:
        """The quota in the spec syntax (``"gpu=2 memory=214748364800"``), "" for none."""
        return format_resources(self.quota)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the wire and the people file (``person_from_dict`` reads it)."""
        return {"name": self.name, "weight": self.weight, "quota": self.quota_text}


def new_person(name: object, weight: object = 1.0, quota: object = "") -> Person:
    """A checked ``Person``; ``ValueError`` in one line naming what is wrong."""
    if not isinstance(quota, str):
        raise ValueError(f"invalid quota {quota!r}: give text like 'gpu=2 memory=200GiB'")
    return Person(check_person_name(name), check_weight(weight), parse_quota(quota))


def person_from_dict(data: object) -> Person:
    """The inverse of ``Person.to_dict``, checked as ``new_person`` checks."""
    if not isinstance(data, dict):
        raise ValueError(f"a person must be a mapping, not {type(data).__name__}")
    return new_person(data.get("name"), data.get("weight", 1.0), data.get("quota", ""))
