"""One worker's ledger: what it offers, what is free now, and which units are free.

All resource arithmetic of the scheduler lives here: whether a demand fits, taking
it, giving it back, and which units of an indexed pool a task gets. Amounts are
integer ticks (``core.resources``), so taking and giving back the same demand
restores the ledger exactly.

An indexed pool (``gpu=[0,1,2,3]``) is also an amount (four units), so the amount
arithmetic decides whether a request fits in total; the units decide *which* ones
it gets. Whole requests take whole free units; a fraction (at most one unit)
shares a unit, packed onto the fullest unit that still has room, so that whole
units stay free for whole requests.

Pure and small on purpose: placement calls ``can_take`` for every candidate worker
of every task it starts, so the loops are plain dictionary walks.
"""

from __future__ import annotations

from collections.abc import Mapping

from apportion.core.resources import SCALE, Amounts, Units


class LedgerError(AssertionError):
    """Resources taken beyond what is free, or given back twice: always a bug."""


def splittable(need: int) -> bool:
    """An indexed pool gives whole units, or a fraction (at most 1) of one unit."""
    return need <= SCALE or need % SCALE == 0


def pick_units(unit_free: Mapping[str, int], need: int) -> list[str] | None:
    """Which units of an indexed pool to give a request of ``need`` ticks, or None.

    Whole units come whole, in label order. A fraction goes to the unit with the
    least free that still has room: partly used units fill up first (pack, do not
    spread), so whole units stay available for whole requests.
    """
    if need >= SCALE:
        if need % SCALE:
            return None
        whole = [label for label, free in unit_free.items() if free == SCALE]
        count = need // SCALE
        return whole[:count] if len(whole) >= count else None
    best: str | None = None
    for label, free in unit_free.items():
        if free >= need and (best is None or free < unit_free[best]):
            best = label
    return None if best is None else [best]


def matching_units(total: Mapping[str, int], units: Units) -> Units:
    """The unit lists that agree with their pool's amount and list no label twice."""
    return {
        name: labels
        for name, labels in units.items()
        if total.get(name) == len(labels) * SCALE and len(set(labels)) == len(labels)
    }


def describe_units(held: Mapping[str, list[str]]) -> str:
    """``gpu [2,3]``: how stories and explanations name the units a task holds."""
    return ", ".join(f"{name} [{','.join(labels)}]" for name, labels in sorted(held.items()))


class Ledger:
    """A worker's supply, what of it is free now, and the free share of each unit."""

    __slots__ = ("free", "total", "units")

    def __init__(self, total: Amounts, units: Units | None = None) -> None:
        #: Declared supply in ticks; never changes.
        self.total: Amounts = dict(total)
        #: ``total`` minus every demand taken and not given back; in ``[0, total]``.
        self.free: Amounts = dict(total)
        #: Indexed pools: name -> unit label -> free ticks (each unit holds SCALE).
        #: Per pool, the ticks taken from its units equal those taken from ``free``.
        self.units: dict[str, dict[str, int]] = {
            name: dict.fromkeys(labels, SCALE) for name, labels in (units or {}).items()
        }

    # --- questions ------------------------------------------------------------------

    def fits(self, demand: Mapping[str, int]) -> bool:
        """Every amount of ``demand`` is free now (units not considered)."""
        free = self.free
        for name, need in demand.items():
            if free.get(name, 0) < need:
                return False
        return True

    def can_take(self, demand: Mapping[str, int], held_back: Mapping[str, int] | None) -> bool:
        """``take(demand)`` would succeed, leaving ``held_back`` (a reservation's demand)
        untouched as far as it is free."""
        free = self.free
        units = self.units
        for name, need in demand.items():
            left = free.get(name, 0)
            if held_back is not None:
                left -= min(left, held_back.get(name, 0))
            if left < need:
                return False
            if units and name in units and pick_units(units[name], need) is None:
                return False  # enough in total, but not in units that fit this request
        return True

    def available(self, name: str, held_back: Mapping[str, int] | None) -> int:
        """Free ticks of ``name`` beyond what ``held_back`` keeps for a reservation."""
        free = self.free.get(name, 0)
        if held_back is not None:
            free -= min(free, held_back.get(name, 0))
        return free

    def has_unit_room(self, name: str, need: int) -> bool:
        """Some units of ``name`` can hold ``need`` (True for an amount pool)."""
        unit_free = self.units.get(name)
        return unit_free is None or pick_units(unit_free, need) is not None

    def could_hold(self, demand: Mapping[str, int]) -> bool:
        """Could this worker run ``demand`` when idle? (Its supply, not what is free.)"""
        total = self.total
        for name, need in demand.items():
            if total.get(name, 0) < need:
                return False
        return all(splittable(demand[name]) for name in self.units if name in demand)

    def missing(self, demand: Mapping[str, int]) -> dict[str, int]:
        """The part of ``demand`` that the supply (not what is free) can never meet."""
        total = self.total
        return {
            name: need - total.get(name, 0)
            for name, need in demand.items()
            if total.get(name, 0) < need
        }

    # --- changes --------------------------------------------------------------------

    def take(self, demand: Mapping[str, int], wanted: Units | None = None) -> Units:
        """Take ``demand`` (``can_take`` held); return the units it now holds.

        ``wanted``: take exactly these units if they are free (an adopted run keeps
        the devices its processes already use); else pick them.
        """
        free = self.free
        for name, need in demand.items():
            left = free[name] - need
            if left < 0:
                raise LedgerError(f"ledger over-committed on {name!r}")
            free[name] = left
        if not self.units:
            return {}
        given = self._take_given(demand, wanted) if wanted else None
        return given if given is not None else self._take_units(demand)

    def give(self, demand: Mapping[str, int], held: Units | None) -> None:
        """Give back exactly what ``take`` took; beyond the supply is a double release."""
        free, total = self.free, self.total
        for name, need in demand.items():
            back = free[name] + need
            if back > total[name]:
                raise LedgerError(f"ledger released {name!r} twice")
            free[name] = back
        for name, labels in (held or {}).items():
            unit_free = self.units[name]
            share = min(demand[name], SCALE)
            for label in labels:
                unit_back = unit_free[label] + share
                if unit_back > SCALE:
                    raise LedgerError(f"unit {name}[{label}] released twice")
                unit_free[label] = unit_back

    def take_exactly(self, demand: Mapping[str, int], held: Units) -> bool:
        """Take ``demand`` with exactly the units ``held`` (a task taking back what it
        gave back, ``give(demand, held)``) if all of it is free now; else take nothing."""
        if not self.fits(demand):
            return False
        if self.units and self._take_given(demand, held) is None:
            return False
        free = self.free
        for name, need in demand.items():
            free[name] -= need
        return True

    def _take_units(self, demand: Mapping[str, int]) -> Units:
        held: Units = {}
        for name, need in demand.items():
            unit_free = self.units.get(name)
            if unit_free is None:
                continue
            labels = pick_units(unit_free, need)
            if labels is None:
                raise LedgerError(f"{name}: no units for {need} ticks")
            share = min(need, SCALE)
            for label in labels:
                unit_free[label] -= share
            held[name] = labels
        return held

    def _take_given(self, demand: Mapping[str, int], wanted: Units) -> Units | None:
        """Take exactly the ``wanted`` units, or None with nothing taken if a label is
        unknown, has too little room, or the count does not match the demand."""
        plan: list[tuple[str, list[str], int]] = []
        for name, need in demand.items():
            unit_free = self.units.get(name)
            if unit_free is None:
                continue
            labels = wanted.get(name, [])
            share = min(need, SCALE)
            count = need // SCALE if need >= SCALE else 1
            if len(labels) != count or len(set(labels)) != count:
                return None
            if any(unit_free.get(label, -1) < share for label in labels):
                return None
            plan.append((name, labels, share))
        for name, labels, share in plan:
            for label in labels:
                self.units[name][label] -= share
        return {name: labels for name, labels, _ in plan}

    # --- views ----------------------------------------------------------------------

    def unit_view(self) -> dict[str, dict[str, float]]:
        """Free share of every unit, in units (``{"gpu": {"0": 1.0, "1": 0.5}}``)."""
        return {
            name: {label: left / SCALE for label, left in unit_free.items()}
            for name, unit_free in self.units.items()
        }

    def check(self) -> None:
        """Raise ``AssertionError`` if the ledger contradicts itself."""
        for name, total in self.total.items():
            free = self.free[name]
            assert 0 <= free <= total, f"{name} free {free} outside [0, {total}]"
        assert self.free.keys() == self.total.keys(), "free and total name different pools"
        for name, unit_free in self.units.items():
            for label, left in unit_free.items():
                assert 0 <= left <= SCALE, f"{name}[{label}] free {left}"
            taken = sum(SCALE - left for left in unit_free.values())
            assert taken == self.total[name] - self.free[name], f"{name} units != ledger"
