"""What a task or run asks for: one value from where the request enters to the thread.

Theory of operation
-------------------
A request's resources arrive in many spellings (``resources={"GPU": 1}``, a list of
alternatives, ``dask.annotate(resources=...)``, ``--resources gpu=1`` on the command
line, a run spec's text in the journal). Each is parsed once, where it enters, into a
``Demand``; from then on the same value is carried: in the client until it is sent,
in the scheduler's task record and queue keys, in a run's spec. Only the wire and the
journal see it as plain data (``TaskSpec.resources``/``alternatives``, a run's text),
and the receiving side makes one ``Demand`` of that once.

A demand holds one or more *alternatives*, each an ``Amounts`` in ticks
(``core.resources``), in order of preference: the task runs with the first that fits
on some worker now (HyperQueue's resource variants; Dask's single demand is a demand
with one alternative). Which one was chosen is an index that travels with the task's
``Allocation``, so nothing downstream searches the list again.

Demands are immutable and hashable: tasks with equal demands fit in the same places,
so the scheduler queues them together under their demand. Its dicts are shared, never
copied, and must not be mutated (as a ``RunSpec``'s are).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from apportion.core.resources import Amounts, ResourceSpec, describe_resources, parse_demand


class Demand:
    """One request's resources: its alternatives in ticks, in order of preference.

    Never empty: a task that asks for nothing has one empty alternative (``PLAIN``).
    Equal demands hash alike whatever their dicts' order; the hash is kept, since a
    demand is looked up as a queue key for every task that moves.
    """

    __slots__ = ("_hash", "alternatives", "asks")

    alternatives: tuple[Amounts, ...]
    #: Whether any alternative asks for something (else only a thread is needed).
    asks: bool

    def __init__(self, alternatives: Iterable[Amounts]) -> None:
        alternatives = tuple(alternatives)
        if not alternatives:
            raise ValueError("resources: give one demand, or a non-empty list of alternatives")
        self.alternatives = alternatives
        self.asks = any(alternatives)
        self._hash = hash(tuple(frozenset(a.items()) for a in alternatives))

    @property
    def first(self) -> Amounts:
        """The preferred alternative (the only one, for most requests)."""
        return self.alternatives[0]

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Demand):
            return NotImplemented
        return self._hash == other._hash and self.alternatives == other.alternatives

    def __reduce__(self) -> tuple[type[Demand], tuple[tuple[Amounts, ...]]]:
        # Rebuilt, not copied: a string's hash differs from one process to another.
        return (Demand, (self.alternatives,))

    def __repr__(self) -> str:
        return f"Demand({list(self.alternatives)!r})"

    def describe(self) -> str:
        """For people: ``GPU=1``, or ``GPU=1 | CPU=8`` with alternatives."""
        return " | ".join(describe_resources(a) or "nothing" for a in self.alternatives)

    def wire(self) -> tuple[Amounts, list[Amounts]]:
        """As ``TaskSpec`` carries it: the first alternative, and every alternative if
        there are two or more (else an empty list, so a plain task's frame stays small)."""
        return self.first, list(self.alternatives) if len(self.alternatives) > 1 else []


#: What a plain task asks for: only a thread. Shared, so plain tasks allocate nothing.
PLAIN = Demand(({},))


def from_wire(resources: Amounts, alternatives: Sequence[Amounts]) -> Demand:
    """The demand a ``TaskSpec`` carries (its ``resources`` and ``alternatives``)."""
    if len(alternatives) > 1:
        return Demand(alternatives)
    return Demand((resources,)) if resources else PLAIN


def demand_of(resources: ResourceSpec | Sequence[ResourceSpec]) -> Demand:
    """Parse what a user asks for: one demand, or a list of alternatives in order of
    preference (HyperQueue's variants).

    ``[{"gpu": 1, "cpus": 1}, {"cpus": 8}]``: the scheduler runs the task with the first
    alternative that fits on some worker now; the task asks which with ``task_variant()``.
    ``ValueError`` quotes what is wrong, as ``core.resources.parse_demand`` does.
    """
    if resources is None or isinstance(resources, str | Mapping):
        return single(resources)
    if not isinstance(resources, list | tuple) or not resources:
        raise ValueError("resources: give one demand, or a non-empty list of alternatives")
    return Demand(parse_demand(spec) for spec in resources)


def single(resources: ResourceSpec) -> Demand:
    """Parse one demand (no alternatives), as Dask annotations and run specs give it."""
    amounts = parse_demand(resources)
    return Demand((amounts,)) if amounts else PLAIN
