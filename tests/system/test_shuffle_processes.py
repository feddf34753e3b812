"""A shuffle of twice the cluster's memory limit, with real worker processes: it
completes by spilling, gives the answer computed here without apportion, and no
worker is killed. (``benchmarks/shuffle.py`` runs 10 GiB of it beside Dask.)"""

from __future__ import annotations

import sys
from functools import reduce
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from apportion import Client, LocalCluster, wait

pytestmark = pytest.mark.process

# Worker processes cannot import this module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 2**20
#: 128 inputs of 8 MiB, 1 GiB of int64 against two workers of 250 MiB, shuffled into
#: 32 outputs. A task's temporaries stay near a tenth of the limit (a split takes
#: about 3.3 times its input; an output reduces its pieces one by one): the thresholds
#: leave a quarter of the limit between spill and terminate for what arrives between
#: two of the monitor's samples, a running task's temporaries included.
INPUTS, OUTPUTS, PARTITION = 128, 32, 8 * MiB
SEED = 7


def make_input(i: int) -> np.ndarray:
    return np.random.default_rng((SEED, i)).integers(0, 2**63 - 1, PARTITION // 8, dtype=np.int64)


def split(block: np.ndarray) -> list[np.ndarray]:
    """Piece j holds the values v with v % OUTPUTS == j."""
    bucket = (block % OUTPUTS).astype(np.uint16)
    ordered = block[np.argsort(bucket, kind="stable")]
    return np.split(ordered, np.cumsum(np.bincount(bucket, minlength=OUTPUTS))[:-1])


def pick(pieces: list[np.ndarray], j: int) -> np.ndarray:
    return pieces[j].copy()


def combine(j: int, *pieces: np.ndarray) -> tuple[int, int, int]:
    """(values, sum modulo 2**64, XOR) of output partition ``j``, piece by piece."""
    count = total = xor = 0
    for values in pieces:
        assert bool((values % OUTPUTS == j).all())
        count += values.size
        total += int(values.view(np.uint64).sum(dtype=np.uint64))
        xor ^= int(np.bitwise_xor.reduce(values))
    return count, total % 2**64, xor


def expected() -> tuple[list[tuple[int, int]], int]:
    """Each output's (values, sum modulo 2**64) and the XOR of every value, computed
    here without a shuffle: per-bucket sums of the low and high 32 bits of each input,
    exact in float64 (under 2**53)."""
    counts = np.zeros(OUTPUTS, dtype=np.int64)
    low, high = [0] * OUTPUTS, [0] * OUTPUTS
    xor = 0
    for i in range(INPUTS):
        block = make_input(i)
        bucket = block % OUTPUTS
        counts += np.bincount(bucket, minlength=OUTPUTS)
        for sums, half in ((low, block & 0xFFFFFFFF), (high, block >> 32)):
            for j, total in enumerate(np.bincount(bucket, weights=half, minlength=OUTPUTS)):
                sums[j] += int(total)
        xor ^= int(np.bitwise_xor.reduce(block))
    outputs = [(int(counts[j]), (low[j] + (high[j] << 32)) % 2**64) for j in range(OUTPUTS)]
    return outputs, xor


def files_spilled(dask_worker: Any) -> int:
    return int(dask_worker.memory_manager.store.files_written)


@pytest.mark.timeout(90)
def test_a_shuffle_twice_the_memory_limit_spills_and_gives_the_right_answer(
    tmp_path: Path,
) -> None:
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            memory_limit="250MiB",
            local_directory=tmp_path,
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        pids = cluster.worker_pids()
        picks = []
        for i in range(INPUTS):
            pieces = client.submit(split, client.submit(make_input, i, pure=False), pure=False)
            picks.append(client.map(pick, [pieces] * OUTPUTS, range(OUTPUTS), pure=False))
        outputs = [
            client.submit(combine, j, *(row[j] for row in picks), pure=False)
            for j in range(OUTPUTS)
        ]
        del picks  # only the outputs are held: the rest goes once used
        wait(outputs, timeout=75)
        answer = client.gather(outputs)
        spilled = client.run(files_spilled) or {}
        assert cluster.worker_pids() == pids
        logs = "\n".join(cluster.get_logs().values())
        statuses = [w["status"] for w in client.scheduler_info()["workers"].values()]
    assert sum(spilled.values()) > INPUTS, f"too little was spilled: {spilled}"
    assert "killed by its supervisor" not in logs and "restarting it" not in logs
    assert statuses == ["running", "running"]
    outputs_expected, xor = expected()
    assert [(count, total) for count, total, _ in answer] == outputs_expected
    assert reduce(lambda a, b: a ^ b, (x for _, _, x in answer)) == xor
    assert list(tmp_path.iterdir()) == []  # both workers removed their directories
