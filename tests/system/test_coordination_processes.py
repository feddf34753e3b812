"""Leases of holders that die or freeze, with real processes: a worker killed while a
task of it holds a semaphore, a worker frozen (alive on the network, refreshing
nothing) while it holds one, and a client killed while it holds a lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import cloudpickle
import pytest

from apportion import Client, Lock, Scheduler, Semaphore, Variable
from cli_processes import Processes

pytestmark = [pytest.mark.process, pytest.mark.tcp]

# Worker processes are fresh interpreters that cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Short, so that a frozen holder's lease expires within the test.
LEASE_TIMEOUT = 2.0


def hold(sem: Semaphore, pid_variable: str) -> None:
    """Take a lease, say which process holds it, and never give it back."""
    with sem:
        Variable(pid_variable).set(os.getpid())
        time.sleep(300)


def use(i: int, sem: Semaphore) -> int:
    with sem:
        return sem.get_value()


@pytest.mark.timeout(120)
def test_a_semaphore_held_by_a_killed_or_frozen_worker_is_released(procs: Processes) -> None:
    address = procs.scheduler()
    a, _ = procs.start("worker", address, "--nthreads", "2", "--name", "a")
    b, _ = procs.start("worker", address, "--nthreads", "2", "--name", "b")
    try:
        with Client(address) as client:
            client.wait_for_workers(2, timeout=30)
            sem = Semaphore(1, "database", lease_timeout=LEASE_TIMEOUT)

            # Killed: its connection ends, and its lease with it.
            holding = client.submit(hold, sem, "a-pid", workers=["a"], pure=False)
            assert Variable("a-pid").get(timeout=30) == a.pid
            assert not sem.acquire(timeout=0)
            os.kill(a.pid, signal.SIGKILL)
            started = time.monotonic()
            assert sem.acquire(timeout=20)
            assert time.monotonic() - started < LEASE_TIMEOUT
            sem.release()
            holding.cancel()

            # The semaphore keeps working, from tasks on the other worker.
            assert client.gather(client.map(use, range(4), sem=sem, workers=["b"])) == [1] * 4

            # Frozen: still connected, its refreshes stop; the lease expires.
            frozen = client.submit(hold, sem, "b-pid", workers=["b"], pure=False)
            assert Variable("b-pid").get(timeout=30) == b.pid
            os.kill(b.pid, signal.SIGSTOP)
            started = time.monotonic()
            assert sem.acquire(timeout=20)
            waited = time.monotonic() - started
            # Refreshed every fifth of the timeout until frozen: it lasts at most that.
            assert LEASE_TIMEOUT * 0.7 < waited < LEASE_TIMEOUT + 2
            assert sem.get_value() == 1 and not frozen.done()
            sem.release()
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)  # a frozen one too
                proc.wait(10)


HOLDER = """
import sys, time
from apportion import Client, Lock
client = Client(sys.argv[1])
assert Lock("shared").acquire()
print("locked", flush=True)
time.sleep(300)
"""


@pytest.mark.timeout(60)
def test_a_lock_held_by_a_crashed_client_is_released() -> None:
    with Scheduler(port=0) as scheduler:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, scheduler.address],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"locked\n"
            with Client(scheduler.address) as client:
                lock = Lock("shared", client)
                assert lock.locked() and not lock.acquire(timeout=0.2)
                holder.kill()
                holder.wait(10)
                assert lock.acquire(timeout=10)  # not the 30 s lease timeout: at once
                assert lock.locked()
                lock.release()
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(10)
            if holder.stdout is not None:
                holder.stdout.close()
