"""Task functions shared by the benchmarks.

A real module, not ``__main__``: both systems pickle these by reference, so each
worker process imports this file. ``share_with_workers()`` puts this directory on
``PYTHONPATH`` before any worker starts, which is what makes that import work in
apportion's fresh worker interpreters and in Dask's spawned worker processes alike.
(The benchmark scripts import this module directly: Python puts a script's own
directory first on ``sys.path``.)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def share_with_workers() -> None:
    """Let worker processes started from now on import this module; quiet Dask's logs."""
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH", "")) if p
    )
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")


def noop(x: object) -> None:
    """Do nothing: the task's cost is all scheduling overhead."""


def inc(x: int) -> int:
    return x + 1


def add(x: int, y: int) -> int:
    return x + y


def sum_of(values: Iterable[int]) -> int:
    return sum(values)


def timed_sleep_apportion(seconds: float) -> tuple[float, float, str]:
    """Sleep on an apportion worker; return wall-clock start, end and the worker's name."""
    import time

    import apportion

    start = time.time()
    time.sleep(seconds)
    return start, time.time(), apportion.get_worker().name


def timed_sleep_dask(seconds: float) -> tuple[float, float, str]:
    """Sleep on a Dask worker; return wall-clock start, end and the worker's name."""
    import time

    import distributed

    start = time.time()
    time.sleep(seconds)
    return start, time.time(), str(distributed.get_worker().name)


#: How long each task of the recovery benchmark sleeps.
SLEEP_SECONDS = 0.005


def sleepy_inc(x: int) -> int:
    """``inc`` that takes 5 ms, like a small real task."""
    import time

    time.sleep(SLEEP_SECONDS)
    return x + 1


def sleepy_add(x: int, y: int) -> int:
    """``add`` that takes 5 ms, like a small real task."""
    import time

    time.sleep(SLEEP_SECONDS)
    return x + y


def is_even(x: int) -> bool:
    return x % 2 == 0


def filled(value: int, nbytes: int) -> Any:
    """A float64 NumPy array of ``nbytes`` bytes, every element ``value``: cheap to make."""
    import numpy as np

    return np.full(nbytes // 8, value, dtype=np.float64)


def array_sum(array: Any) -> float:
    """The sum of ``array``: it reads every byte, at little cost beside moving them."""
    return float(array.sum())


# --- data under a memory limit: spill.py and shuffle.py ------------------------------


def random_block(seed: int, index: int, nbytes: int) -> Any:
    """``nbytes`` of int64 drawn from a generator seeded by ``(seed, index)``: the same
    on every machine and system, and incompressible."""
    import numpy as np

    generator = np.random.default_rng((seed, index))
    return generator.integers(0, 2**63 - 1, nbytes // 8, dtype=np.int64)


def block_checksum(block: Any) -> tuple[int, int]:
    """(elements, sum modulo 2**64) of an int64 block: exact, whatever the order."""
    import numpy as np

    return int(block.size), int(block.view(np.uint64).sum(dtype=np.uint64))


def add_checksums(*checksums: tuple[int, int]) -> tuple[int, int]:
    """Checksums of several blocks as one: counts added, sums modulo 2**64."""
    return sum(c for c, _ in checksums), sum(s for _, s in checksums) % 2**64


def shuffle_split(block: Any, parts: int) -> list[Any]:
    """``block`` cut into ``parts`` pieces by value modulo ``parts``: piece j holds the
    values v with v % parts == j. Views of one sorted copy: picking a piece copies it.
    About 3.3 times the block's memory at the peak."""
    import numpy as np

    bucket = (block % parts).astype(np.uint16)  # 16 bits: a radix sort, in linear time
    order = np.argsort(bucket, kind="stable")
    ordered = block[order]
    del order
    bounds = np.cumsum(np.bincount(bucket, minlength=parts))[:-1]
    return np.split(ordered, bounds)


def shuffle_pick(pieces: list[Any], j: int) -> Any:
    """Piece ``j`` of a split, as an array of its own (the split's memory can go)."""
    return pieces[j].copy()


def shuffle_combine(j: int, parts: int, *pieces: Any) -> tuple[int, int, int]:
    """Output partition ``j`` from its piece of every input: (values, their sum modulo
    2**64, their XOR); raises if a value does not belong here."""
    import numpy as np

    values = np.concatenate(pieces)
    if values.size and not bool((values % parts == j).all()):
        raise AssertionError(f"output partition {j} received a value of another")
    total = int(values.view(np.uint64).sum(dtype=np.uint64))
    return int(values.size), total, int(np.bitwise_xor.reduce(values))


def spill_totals_apportion(dask_worker: Any) -> tuple[int, int]:
    """Run on an apportion worker: (files, bytes) written to its spill directory so far."""
    store = dask_worker.memory_manager.store
    return (0, 0) if store is None else (store.files_written, store.bytes_written)


def spill_totals_dask(dask_worker: Any) -> tuple[int, int]:
    """Run on a Dask worker: (files, bytes) written to its spill directory so far."""
    metrics = getattr(dask_worker.data, "cumulative_metrics", {})
    return int(metrics.get(("disk-write", "count"), 0)), int(
        metrics.get(("disk-write", "bytes"), 0)
    )


def _halves(n: int) -> list[int]:
    """A subtree of ``n`` tasks is this task and two subtrees of the other ``n - 1``."""
    left = (n - 1) // 2
    return [size for size in (left, n - 1 - left) if size]


def fan_out(n: int, library: str) -> int:
    """A task that submits the rest of its subtree of ``n`` tasks and waits, seceded,
    as Dask's "Launch Tasks from Tasks" page writes it; returns how many tasks ran
    (``n``). ``library``: "apportion" or "distributed", both with the same names."""
    lib = importlib.import_module(library)
    sizes = _halves(n)
    if not sizes:
        return 1
    client = lib.get_client()
    futures = [client.submit(fan_out, size, library, pure=False) for size in sizes]
    lib.secede()
    counts = client.gather(futures)
    lib.rejoin()
    return 1 + sum(counts)


# --- connections counted where they are accepted: security.py ------------------------


def count_handshakes() -> dict[str, int]:
    """Handshakes this process's listeners completed, by the connecting peer's role.

    The first call wraps the listener's side of apportion's handshake
    (``apportion.net.handshake._check``, which every listener of the process passes
    through: the scheduler's, a worker's data port) to count each completed one;
    every call returns the counts so far. Run in the benchmark's process and, with
    ``client.run``, in each worker process."""
    from collections import Counter

    from apportion.net import handshake

    counts: Counter[str] | None = getattr(handshake, "_bench_accepted", None)
    if counts is None:
        counts = Counter()
        check = handshake._check

        async def counted(conn: Any, roles: set[str], key: bytes) -> Any:
            hello = await check(conn, roles, key)
            counts[hello.role] += 1
            return hello

        handshake._check = counted
        handshake._bench_accepted = counts
    return dict(counts)


# --- the shapes of a node: shapes.py --------------------------------------------------


def spin(seconds: float) -> None:
    """Hold the GIL for ``seconds``: a pure-Python loop, as CPU-bound Python code does."""
    import time

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def nap(seconds: float) -> None:
    """Release the GIL for ``seconds``, as I/O or NumPy's large operations do."""
    import time

    time.sleep(seconds)


# --- uneven durations: uneven.py -------------------------------------------------------
#
# One function per case, so that each case's tasks share one key prefix (one task group,
# whose durations a scheduler may learn) and no case inherits what another taught.


def _slept(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds


def six_trials(seconds: float) -> float:
    """Case a: one of six trials, the long one first; sleeps ``seconds``, returns them."""
    return _slept(seconds)


def six_trials_long_second(seconds: float) -> float:
    """Case a': one of the same six trials, the long one second."""
    return _slept(seconds)


def sweep_trial(seconds: float) -> float:
    """Case b: one trial of a sweep of log-normal durations."""
    return _slept(seconds)


def sweep_trial_tail(seconds: float) -> float:
    """Case c: one trial of a sweep in which a tenth of the trials run 20 times longer."""
    return _slept(seconds)


def sweep_trial_with_input(seconds: float, data: bytes) -> float:
    """Case d: one trial of the sweep that reads an input made on one worker."""
    if not data:
        raise ValueError("the trial's input arrived empty")
    return _slept(seconds)


def random_bytes(nbytes: int) -> bytes:
    """``nbytes`` random bytes: an input no transport can shrink by compressing it."""
    import os

    return os.urandom(nbytes)


# --- fair shares: fairness.py ----------------------------------------------------------


def trial_a(seconds: float, index: int) -> tuple[float, float]:
    """Person A's trial: sleep ``seconds``; the wall-clock start and end."""
    import time

    start = time.time()
    time.sleep(seconds)
    return start, time.time()


def trial_b(seconds: float, index: int) -> tuple[float, float]:
    """Person B's trial (its own function: its own task group on both systems)."""
    return trial_a(seconds, index)
