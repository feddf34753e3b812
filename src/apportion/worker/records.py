"""The worker's own records: where a key is on this worker, the moves it may make,
and what is kept of a task assigned here and of a value being fetched.

Named as the scheduler names its view of the same things (``scheduler/records.py``),
so that ``WorkerState`` (``state.py``) holds the rules and this module the data they
move. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apportion.core.allocation import Allocation
from apportion.core.payload import Pickled

#: Where a key is on this worker (its story's states). Only WAITING, READY and
#: EXECUTING are an ``AssignedTask``'s state; the others describe the key's value.
RELEASED = "released"  #: neither a task here nor a value in the data store
WAITING = "waiting"  #: a task whose inputs are not all in memory here
READY = "ready"  #: a task with every input here, waiting for a thread
EXECUTING = "executing"  #: a task running on a thread
FETCHING = "fetching"  #: a value being fetched from a peer
MEMORY = "memory"  #: a value in the data store

#: Every move a key may make on a worker, as (from, to). Anything else is a bug and
#: raises ``IllegalTransition``.
WORKER_TASK_MOVES = frozenset(
    {
        (RELEASED, WAITING),
        (RELEASED, READY),
        (RELEASED, FETCHING),
        (RELEASED, MEMORY),
        (WAITING, READY),
        (WAITING, MEMORY),
        (WAITING, RELEASED),
        (READY, EXECUTING),
        (READY, MEMORY),
        (READY, RELEASED),
        (EXECUTING, EXECUTING),
        (EXECUTING, MEMORY),
        (EXECUTING, RELEASED),
        (FETCHING, FETCHING),
        (FETCHING, MEMORY),
        (FETCHING, RELEASED),
        (MEMORY, MEMORY),
        (MEMORY, RELEASED),
    }
)


@dataclass(slots=True)
class AssignedTask:
    """The worker's own record of one task the scheduler assigned to it and that it
    has not reported yet (the scheduler's view of a task is ``scheduler.records.TaskRecord``)."""

    key: str
    func_id: str
    args: Pickled
    deps: tuple[str, ...]
    allocation: Allocation  #: what it holds, as the scheduler allocated it
    priority: int
    seq: int  #: arrival order; breaks ties in the ready order
    state: str  #: WAITING, READY or EXECUTING
    missing: set[str] = field(default_factory=set)  #: deps not in memory; empty unless waiting
    freed: bool = False  #: freed while executing: report it, then discard the result
    order: int = 0  #: the scheduler's start order (``ComputeTask.order``)


@dataclass(slots=True)
class FetchRecord:
    """One dependency being fetched; exactly one request for it is in flight."""

    holders: list[str]  #: every holder named so far, in the order tried
    index: int = 0  #: the holder asked now
    nbytes: int = 0  #: its size as the scheduler knew it (0: not known)
    asked: bool = False  #: a request for it is in flight (its bytes count as coming)

    @property
    def address(self) -> str:
        return self.holders[self.index]
