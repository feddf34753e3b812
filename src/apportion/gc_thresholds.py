"""How often Python's cyclic garbage collector runs while a scheduler or a worker does.

The collector looks at the youngest objects every 700 container allocations (the
interpreter's default) and at every live object once the survivors grow by a
quarter. A scheduler allocates tens of containers per task and keeps every queued
task's record alive, so with the default it ran a full collection every few thousand
tasks: 0.24 s of the 1.8 s that 30,000 no-op tasks took on a ``LocalCluster`` (six
full collections of 100,000 objects, 25 ms each). Looking at the youngest objects
every ``YOUNG_THRESHOLD`` allocations instead took 0.06 s; cycles are still
collected, a little later.

A scheduler or worker service raises the first threshold while it runs, and puts
back what it found when the last one in the process stops (they share the process
in an embedded cluster, in the user's own program). Thresholds someone already set
at least as high are left as they are, as is a collector someone turned off.
"""

from __future__ import annotations

import gc
import threading

#: Container allocations between two looks at the youngest objects.
YOUNG_THRESHOLD = 50_000

_lock = threading.Lock()
_holders = 0
#: The thresholds found when the first service started; None when they were kept.
_found: tuple[int, ...] | None = None


def hold_gc_thresholds() -> None:
    """A service starts: the thresholds are raised while at least one runs."""
    global _holders, _found
    with _lock:
        _holders += 1
        if _holders > 1:
            return
        found = gc.get_threshold()
        if not gc.isenabled() or found[0] >= YOUNG_THRESHOLD:
            _found = None
            return
        _found = found
        gc.set_threshold(YOUNG_THRESHOLD, *found[1:])


def release_gc_thresholds() -> None:
    """A service stopped: the last one puts back the thresholds it found, unless
    someone changed them meanwhile."""
    global _holders, _found
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders or _found is None:
            return
        if gc.get_threshold()[0] == YOUNG_THRESHOLD:
            gc.set_threshold(*_found)
        _found = None
