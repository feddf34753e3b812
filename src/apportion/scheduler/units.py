"""The units of indexed pools: which ones a task gets, and giving them back.

An indexed pool (``gpu=[0,1,2,3]``) is also an amount in the worker's ledger (four
units), so the usual arithmetic decides whether a request fits in total; this
module decides *which* units it gets. Whole requests take whole free units;
a fraction (at most one unit) shares a unit, packed onto the fullest unit that still
has room, so that whole units stay free for whole requests.
"""

from __future__ import annotations

from apportion.core.resources import SCALE, fits
from apportion.scheduler.records import WorkerRecord


def splittable(need: int) -> bool:
    """An indexed pool gives whole units, or a fraction (at most 1) of one unit."""
    return need <= SCALE or need % SCALE == 0


def could_hold(worker: WorkerRecord, demand: dict[str, int]) -> bool:
    """Could ``worker`` run this request when idle? (Its supply, not what is free.)"""
    if not fits(demand, worker.total):
        return False
    return all(splittable(demand[name]) for name in worker.units if name in demand)


def pick_units(unit_free: dict[str, int], need: int) -> list[str] | None:
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


def take_units(worker: WorkerRecord, demand: dict[str, int]) -> dict[str, list[str]]:
    """Give a task concrete units of each indexed pool it asks for (``fits_now`` held)."""
    held: dict[str, list[str]] = {}
    for name, need in demand.items():
        unit_free = worker.units.get(name)
        if unit_free is None:
            continue
        labels = pick_units(unit_free, need)
        if labels is None:
            raise AssertionError(f"{name}: no units for {need} ticks on {worker.name}")
        share = min(need, SCALE)
        for label in labels:
            unit_free[label] -= share
        held[name] = labels
    return held


def take_given_units(
    worker: WorkerRecord, demand: dict[str, int], wanted: dict[str, list[str]]
) -> dict[str, list[str]] | None:
    """Take exactly the ``wanted`` units (an adopted run keeps its devices), or None.

    None, with nothing taken, if a label is unknown, has too little room, or the
    count does not match the demand.
    """
    plan: list[tuple[str, list[str], int]] = []
    for name, need in demand.items():
        unit_free = worker.units.get(name)
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
            worker.units[name][label] -= share
    return {name: labels for name, labels, _ in plan}


def return_units(worker: WorkerRecord, demand: dict[str, int], held: dict[str, list[str]]) -> None:
    """Give back exactly what ``take_units`` took; more than a unit holds is a double release."""
    for name, labels in held.items():
        unit_free = worker.units[name]
        share = min(demand[name], SCALE)
        for label in labels:
            back = unit_free[label] + share
            if back > SCALE:
                raise AssertionError(f"unit {name}[{label}] released twice on {worker.name}")
            unit_free[label] = back


def describe_units(held: dict[str, list[str]]) -> str:
    """``gpu [2,3]``: how stories and explanations name the units a task holds."""
    return ", ".join(f"{name} [{','.join(labels)}]" for name, labels in sorted(held.items()))
