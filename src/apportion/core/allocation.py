"""What a task runs with, as the scheduler decided it: one value from decision to thread.

The scheduler picks one of the alternatives of the task's ``Demand`` and the units of
indexed pools it takes; the same ``Allocation`` travels in ``ComputeTask`` to the
worker, waits in the worker's task record and reaches the running task's context,
instead of three fields copied one by one at every step.

A ``NamedTuple`` rather than a dataclass: it is immutable, travels as a msgpack
array like ``TaskSpec`` (so ``protocol.validate`` checks its fields as columns),
and costs one small tuple per running task.
"""

from __future__ import annotations

from typing import NamedTuple

from apportion.core.resources import Amounts, Units


class Allocation(NamedTuple):
    """The resources a running task holds. Never mutated: its dicts are not changed."""

    #: The amounts it runs with, in ticks: the alternative of its ``Demand`` chosen.
    resources: Amounts
    #: Indexed pools: the unit labels it holds, as text (``{"gpu": ["2", "3"]}``).
    units: Units
    #: Which of the task's alternatives ``resources`` is (0 if it gave one): chosen by
    #: placement and carried here, so the worker and ``task_variant()`` never search.
    alternative: int = 0


#: What a plain task holds: nothing. Shared, so plain tasks allocate no tuple.
NOTHING = Allocation({}, {}, 0)
