"""Bytes per second between workers and to the client, apportion beside Dask in the same run.

Both systems get the same cluster, started as command-line processes: a scheduler and
2 worker processes of 2 threads each, all on loopback TCP. apportion's are ``apportion
scheduler`` and ``apportion worker`` (``queue_throughput._cluster``); Dask's are
``dask scheduler`` and ``dask worker --no-nanny`` (apportion's single worker process
has no supervisor either) with ``--memory-limit 0`` (apportion's default is none, so
neither spills nor pauses). Worker A has a resource ``produce=2`` and worker B
``consume=2``: the same mechanism, documented by both, pins tasks on both systems.
Dask's compression is turned off (its default already): the arrays are constant,
and a compressing transport would not move their bytes. Each system fetches as it
does by default: apportion's client gathers from the workers directly when it can
reach them, Dask's through its scheduler; apportion's processes, all on one machine
here, read each other's large buffers from memory where the kernel lets them
(``net/lending.py``), Dask's send them over TCP.

For each array size S of 16, 64 and 256 MiB, with N = 1 GiB / S (64, 16, 4):

a. worker to worker: N producer tasks (``resources={"produce": 1}``) each fill a
   float64 array of S bytes on A; once all are in memory, N consumer tasks
   (``{"consume": 1}``) each sum one of them on B. Timed from the first consumer's
   submit until every sum is back in the client: moving N x S = 1 GiB plus sums that
   read it once. Each round checks that one worker held every array and the other
   every sum.
b. gather: 4 of the arrays (4 x S bytes) gathered to the client, timed alone.

Every round starts with the scheduler holding no task, and one untimed warm-up round
precedes ``--repeat`` timed ones at each size. The figures are medians in GiB/s
(2**30 bytes per second), and the ratio is apportion's median over Dask's.

The machine's loopback bandwidth is measured first, in the same run: one TCP
connection over 127.0.0.1 from a child process sending 64 MiB at a time to this
process receiving into a 1 GiB buffer whose pages are already in place, the same 1 GiB
per round (warm-up, then ``--repeat`` rounds). That is the ceiling for any transfer
over TCP here: the kernel copies the bytes in and out once, and nothing else does.
A transfer that reads the sender's memory copies them once only, and may pass it.

``--systems apportion-tcp`` runs apportion with lending off (``APPORTION_LENDING=0``),
every byte over TCP as between two machines.

Usage: ``python benchmarks/data_transfer.py [--repeat N] [--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import tasks
from harness import settle_apportion, settle_dask, wait_until
from queue_throughput import START_TIMEOUT, _cluster, _start, _stop

tasks.share_with_workers()
# Set before distributed is imported here and inherited by Dask's processes.
os.environ["DASK_DISTRIBUTED__COMM__COMPRESSION"] = "False"

MiB = 2**20
GiB = 2**30
#: Bytes moved worker to worker per round: N arrays of S bytes.
TOTAL = GiB
SIZES = [16 * MiB, 64 * MiB, 256 * MiB]
#: Arrays gathered to the client per round.
GATHERED = 4
N_THREADS = 2
#: One resource per worker: producers ask the first, consumers the second.
POOLS = [f"produce={N_THREADS}", f"consume={N_THREADS}"]
REPEAT = 3
#: Longest wait for one round's tasks, so that a stuck system cannot hang the suite.
ROUND_TIMEOUT = 300.0
#: Bytes per send() of the loopback test: large, as when one array goes in one piece.
LOOPBACK_CHUNK = 64 * MiB

# The loopback test's sender, run as its own process. Two processes rather than a
# thread beside this one: worker A and worker B are processes too, each scheduled on
# a core of its own, and no interpreter lock sits between the two ends.
_SENDER = """
import socket, sys
port, total, rounds, chunk = map(int, sys.argv[1:])
data = memoryview(b"\\x01" * chunk)
with socket.create_connection(("127.0.0.1", port)) as sock:
    for _ in range(rounds * (total // chunk)):
        sock.sendall(data)
"""


def loopback_rates(total: int, rounds: int) -> list[float]:
    """GiB/s of each of ``rounds`` back-to-back transfers of ``total`` bytes over
    one TCP connection on 127.0.0.1, from a child process to this one."""
    if total % LOOPBACK_CHUNK:
        raise ValueError(f"total must be a multiple of {LOOPBACK_CHUNK} bytes")
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(START_TIMEOUT)
        port = server.getsockname()[1]
        argv = [sys.executable, "-c", _SENDER, *map(str, (port, total, rounds, LOOPBACK_CHUNK))]
        sender = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        try:
            connection, _ = server.accept()
            with connection:
                connection.settimeout(ROUND_TIMEOUT)
                # bytearray(n) writes its n zeros: every page is mapped before timing.
                buffer = memoryview(bytearray(total))
                rates = [total / _receive(connection, buffer) / GiB for _ in range(rounds)]
            if sender.wait(START_TIMEOUT) != 0:
                raise RuntimeError(f"the loopback sender exited with {sender.returncode}")
            return rates
        finally:
            if sender.poll() is None:
                sender.kill()
                sender.wait()


def _receive(connection: socket.socket, buffer: memoryview) -> float:
    """Seconds to fill ``buffer`` from ``connection``."""
    start = time.perf_counter()
    received = 0
    while received < len(buffer):
        count = connection.recv_into(buffer[received:])
        if count == 0:
            raise ConnectionError("the loopback sender closed the connection early")
        received += count
    return time.perf_counter() - start


@dataclass(frozen=True)
class Round:
    """Seconds of one round at one size."""

    #: N consumers: from the first submit until every sum is in the client.
    transfer: float
    #: ``GATHERED`` arrays to the client.
    gather: float


@dataclass
class Session:
    """A connected client of either system, with that system's ``wait``."""

    client: Any
    wait: Callable[..., Any]
    #: Returns once the scheduler holds no task.
    settle: Callable[[], None]


def one_round(session: Session, size: int) -> Round:
    """Produce ``TOTAL // size`` arrays on one worker, then time moving them to the
    other (a) and gathering ``GATHERED`` of them to the client (b); checks both."""
    client, n = session.client, TOTAL // size
    producers = [
        client.submit(tasks.filled, i, size, resources={"produce": 1}, pure=False) for i in range(n)
    ]
    session.wait(producers, timeout=ROUND_TIMEOUT)
    source = _holder(client, producers, "the arrays")

    start = time.perf_counter()
    consumers = [
        client.submit(tasks.array_sum, array, resources={"consume": 1}, pure=False)
        for array in producers
    ]
    session.wait(consumers, timeout=ROUND_TIMEOUT)
    sums = client.gather(consumers)
    transfer = time.perf_counter() - start
    if sums != [float(i * (size // 8)) for i in range(n)]:
        raise AssertionError(f"wrong sums of {n} arrays of {size:,} bytes")
    if _holder(client, consumers, "the sums") == source:
        raise AssertionError(f"the sums were computed on {source}, beside the arrays")

    start = time.perf_counter()
    arrays = client.gather(producers[:GATHERED])
    gather = time.perf_counter() - start
    for i, array in enumerate(arrays):
        if array.nbytes != size or array[0] != i or array[-1] != i:
            raise AssertionError(f"gathered array {i} is not {size:,} bytes of {i}")
    return Round(transfer, gather)


def _holder(client: Any, futures: list[Any], what: str) -> str:
    """The one worker address holding every result of ``futures``; raises if not one."""
    holders: set[str] = {address for held in client.who_has(futures).values() for address in held}
    if len(holders) != 1:
        raise AssertionError(f"{what} are held by {sorted(holders)}, not by one worker")
    return holders.pop()


def measure(
    open_session: Callable[[], contextlib.AbstractContextManager[Session]],
    repeat: int,
    sizes: list[int],
) -> dict[int, list[Round]]:
    """Timed rounds at each size, each size after an untimed warm-up round."""
    rounds: dict[int, list[Round]] = {}
    with open_session() as session:
        for size in sizes:
            rounds[size] = []
            for i in range(repeat + 1):
                session.settle()
                result = one_round(session, size)
                label = f"round {i}" if i else "warm-up"
                print(f"  {_size(size)}, {label}: {_describe(result, size)}", flush=True)
                if i:
                    rounds[size].append(result)
        session.settle()
    return rounds


def _describe(result: Round, size: int) -> str:
    moved, gathered = TOTAL / result.transfer / GiB, GATHERED * size / result.gather / GiB
    return (
        f"worker to worker {moved:.2f} GiB/s ({result.transfer:.2f} s), "
        f"gather {GATHERED} to client {gathered:.2f} GiB/s ({result.gather:.2f} s)"
    )


def _size(size: int) -> str:
    return f"{size // MiB} MiB x {TOTAL // size}"


@contextlib.contextmanager
def apportion_session() -> Iterator[Session]:
    from apportion import Client, wait

    with tempfile.TemporaryDirectory(prefix="apportion-dt-", ignore_cleanup_errors=True) as tmp:
        pools = [["--resources", pool] for pool in POOLS]
        with _cluster(Path(tmp), len(POOLS), N_THREADS, worker_args=pools) as address:
            client = Client(address)
            try:
                yield Session(client, wait, partial(settle_apportion, client))
            finally:
                client.close()


@contextlib.contextmanager
def apportion_tcp_session() -> Iterator[Session]:
    """apportion with lending off in every process: all bytes over TCP, as between
    machines."""
    from apportion.net.lending import SWITCH

    before = os.environ.get(SWITCH)
    os.environ[SWITCH] = "0"  # inherited by the cluster's processes, read by the client
    try:
        with apportion_session() as session:
            yield session
    finally:
        if before is None:
            del os.environ[SWITCH]
        else:
            os.environ[SWITCH] = before


@contextlib.contextmanager
def dask_session() -> Iterator[Session]:
    import distributed

    with (
        tempfile.TemporaryDirectory(prefix="dask-dt-", ignore_cleanup_errors=True) as tmp,
        _dask_cluster(Path(tmp), [_dask_pool_args(pool) for pool in POOLS]) as scheduler_file,
    ):
        client = distributed.Client(scheduler_file=str(scheduler_file))
        try:
            client.wait_for_workers(len(POOLS), timeout=START_TIMEOUT)
            yield Session(client, distributed.wait, partial(settle_dask, client))
        finally:
            client.close()


def _dask_pool_args(pool: str) -> list[str]:
    """Options of the Dask worker offering ``pool``: no nanny, no memory limit."""
    args = ["--nthreads", str(N_THREADS), "--no-nanny", "--memory-limit", "0"]
    return [*args, "--resources", pool]


@contextlib.contextmanager
def _dask_cluster(base: Path, worker_args: Sequence[Sequence[str]]) -> Iterator[Path]:
    """``dask scheduler`` and a ``dask worker`` per entry of ``worker_args`` (its
    options beside the scheduler file, host, name and ``--no-dashboard``), as
    processes; yields the scheduler file once it is written. All are stopped on
    exit, as ``_cluster`` does."""
    env = dict(os.environ)
    command = [sys.executable, "-m", "dask"]
    scheduler_file = base / "scheduler.json"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        argv = [*command, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
        argv += ["--scheduler-file", str(scheduler_file)]
        procs.append(_start(argv, base / "scheduler.log", env))
        wait_until(
            partial(_written, scheduler_file, procs[0]),
            "dask scheduler did not write its file",
            START_TIMEOUT,
        )
        for i, args in enumerate(worker_args):
            argv = [*command, "worker", "--scheduler-file", str(scheduler_file)]
            argv += ["--host", "127.0.0.1", "--name", f"w{i}", "--no-dashboard", *args]
            procs.append(_start(argv, base / f"w{i}.log", env))
        yield scheduler_file
    finally:
        _stop(procs)


def _written(path: Path, proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``path`` holds whole JSON; raises if ``proc``, which writes it, has exited."""
    if proc.poll() is not None:
        raise RuntimeError(f"dask scheduler exited ({proc.returncode})")
    try:
        json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return True


def report(
    loopback: float, results: dict[str, dict[int, list[Round]]], repeat: int, sizes: list[int]
) -> None:
    print()
    print(
        f"Data transfer: {len(POOLS)} worker processes x {N_THREADS} threads, loopback TCP, "
        f"median of {repeat} timed round{'s' if repeat > 1 else ''} per figure"
    )
    print(f"loopback TCP, one connection between 2 processes: {loopback:.2f} GiB/s")
    print(
        "(best: the fastest round's rate; this machine's rounds are slowed at random where "
        "a process first touches memory the virtual machine has not backed yet)"
    )
    for size in sizes:
        for label, moved, seconds in (
            ("worker to worker", TOTAL, lambda r: r.transfer),
            (f"gather {GATHERED} to client", GATHERED * size, lambda r: r.gather),
        ):
            medians, bests = {}, {}
            for system, rounds in results.items():
                times = [seconds(r) for r in rounds[size]]
                medians[system] = moved / statistics.median(times) / GiB
                bests[system] = moved / min(times) / GiB
            print(f"{size // MiB:>3} MiB {label:<18}: {_compare(medians, bests, loopback)}")


def _compare(medians: dict[str, float], bests: dict[str, float], loopback: float) -> str:
    """One figure's line: each system's median and best GiB/s, their ratios, and each
    median as a share of loopback."""
    text = ", ".join(
        f"{system} {rate:.2f} GiB/s (best {bests[system]:.2f})" for system, rate in medians.items()
    )
    if "dask" in medians:
        for system in [s for s in medians if s != "dask"]:
            ratio = medians[system] / medians["dask"]
            best = bests[system] / bests["dask"]
            text += f", {system}/dask {ratio:.2f}x (best {best:.2f}x)"
    shares = ", ".join(f"{system} {rate / loopback:.0%}" for system, rate in medians.items())
    return f"{text}; of loopback: {shares}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=REPEAT, help="timed rounds per size")
    parser.add_argument(
        "--systems",
        default="apportion,dask",
        help="comma-separated, of apportion, apportion-tcp (lending off) and dask",
    )
    parser.add_argument(
        "--sizes",
        default=",".join(str(size // MiB) for size in SIZES),
        help="array sizes in MiB, comma-separated, each dividing 1024",
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    sizes = [int(mib) * MiB for mib in args.sizes.split(",")]
    if any(size <= 0 or TOTAL % size for size in sizes):
        parser.error("--sizes must divide 1024 MiB")
    sessions = {
        "apportion": apportion_session,
        "apportion-tcp": apportion_tcp_session,
        "dask": dask_session,
    }
    systems = args.systems.split(",")
    if unknown := [s for s in systems if s not in sessions]:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    print(
        f"data transfer: {TOTAL // GiB} GiB worker to worker per round, {GATHERED} arrays "
        f"gathered; {len(POOLS)} workers x {N_THREADS} threads",
        flush=True,
    )

    rates = loopback_rates(TOTAL, args.repeat + 1)
    loopback = statistics.median(rates[1:])
    shown = ", ".join(f"{rate:.2f}" for rate in rates[1:])
    print(f"loopback TCP: {loopback:.2f} GiB/s (rounds {shown}; warm-up {rates[0]:.2f})")

    results: dict[str, dict[int, list[Round]]] = {}
    for system in systems:
        print(f"{system}:", flush=True)
        start = time.perf_counter()
        results[system] = measure(sessions[system], args.repeat, sizes)
        print(f"  ({time.perf_counter() - start:.1f} s including start-up)", flush=True)
    report(loopback, results, args.repeat, sizes)


if __name__ == "__main__":
    main()
