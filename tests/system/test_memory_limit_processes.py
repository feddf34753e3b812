"""Spilling with real worker processes and real memory: more results than the memory
limit all survive, none of the workers is killed, and a worker killed with spilled
results has them recomputed and its directory cleaned by the next worker. A result
larger than the limit fails out of memory instead of killing worker after worker."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

from apportion import Client, LocalCluster, OutOfMemoryError, WorkerCrashedError, wait

pytestmark = pytest.mark.process

# Worker processes cannot import this module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 2**20


def block(i: int, mib: int) -> np.ndarray:
    """``mib`` MiB of bytes all equal to ``i``: easy to check, impossible to compress away."""
    return np.full(mib * MiB, i % 256, dtype=np.uint8)


def ones(mib: int) -> np.ndarray:
    """``mib`` MiB of ones: every page written, so all of it is resident."""
    return np.ones(mib * MiB, dtype=np.uint8)


def doubled(block: np.ndarray) -> np.ndarray:
    return block * 2


def spill_files(base: Path) -> list[Path]:
    return sorted(base.glob("apportion-worker-*/spill/*"))


@pytest.mark.timeout(120)
def test_more_results_than_the_memory_limit_all_come_back_and_no_worker_dies(
    tmp_path: Path,
) -> None:
    # 400 MiB of results held by futures, against a 300 MiB limit. The worker keeps
    # up to its target (180 MiB) of results in memory over an interpreter of about
    # 50 MiB, and sending a result takes about three more copies of it today (pickled,
    # framed, buffered): blocks of a few MiB keep that under the 285 MiB terminate
    # threshold with room to spare (a 200 MiB limit would leave only ~20 MiB).
    count, size = 80, 5
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            memory_limit="300MiB",
            local_directory=tmp_path,
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        (pid,) = cluster.worker_pids()
        futures = [client.submit(block, i, size) for i in range(count)]
        wait(futures, timeout=60)
        assert spill_files(tmp_path), "nothing was spilled"
        # One at a time: each comes back from disk and leaves again for the next.
        for i, future in enumerate(futures):
            value = future.result(timeout=60)
            assert value.shape == (size * MiB,) and value[0] == i and value[-1] == i
            assert bool((value == i).all())
            del value
        assert cluster.worker_pids() == {pid}
        assert "killed by its supervisor" not in cluster.get_logs()["scheduler"]
        info = client.scheduler_info()["workers"]
        assert [w["status"] for w in info.values()] == ["running"]
    assert list(tmp_path.iterdir()) == []  # the worker removed its directory


@pytest.mark.timeout(120)
def test_spilled_results_of_a_killed_worker_are_recomputed_from_lineage(
    tmp_path: Path,
) -> None:
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            memory_limit="200MiB",
            memory_target_fraction=0.05,  # 10 MiB in memory: the rest goes to disk
            local_directory=tmp_path,
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        # Their inputs are released once computed: only their recipes are kept.
        futures = [client.submit(doubled, client.submit(block, i, 4)) for i in range(8)]
        wait(futures, timeout=60)
        # Spilled as they were stored, before they were reported done.
        assert len(spill_files(tmp_path)) >= 5
        (victim,) = cluster.worker_pids()
        (directory,) = tmp_path.glob("apportion-worker-*")
        os.kill(victim, signal.SIGKILL)
        for i, future in enumerate(futures):
            value = future.result(timeout=60)
            assert value.nbytes == 4 * MiB and bool((value == (2 * i) % 256).all())
        (fresh,) = cluster.worker_pids()
        assert fresh != victim
        assert not directory.exists()  # the new worker removed the dead one's
        assert len(list(tmp_path.glob("apportion-worker-*"))) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("terminate", [None, False], ids=["terminate-0.95", "terminate-off"])
def test_a_result_larger_than_the_memory_limit_fails_out_of_memory(
    tmp_path: Path, terminate: bool | None
) -> None:
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            memory_limit="300MiB",
            memory_terminate_fraction=terminate,
            local_directory=tmp_path,
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        (pid,) = cluster.worker_pids()
        with pytest.raises((OutOfMemoryError, WorkerCrashedError)) as caught:
            client.submit(ones, 400).result(timeout=40)
        text = str(caught.value)
        assert "out of memory" in text and "300.0 MiB" in text, text
        if isinstance(caught.value, OutOfMemoryError):
            # The worker's verdict as the task returned: the array was dropped at once.
            assert "(numpy.ndarray of 400.0 MiB)" in text, text
        else:
            # Its supervisor killed it above 285 MiB while the array was being written,
            # before the task returned, three times: the crash verdict says memory too.
            assert terminate is None, text
            assert text.count("killed by its supervisor") == 3, text
            assert "Each of them ran out of memory" in text, text
        if terminate is False:  # nobody kills it: the worker's verdict, every time
            assert isinstance(caught.value, OutOfMemoryError)
            assert cluster.worker_pids() == {pid}  # never restarted
        cluster.wait_for_workers(1, timeout=20)
        assert client.submit(ones, 1).result(timeout=20).sum() == MiB
