"""Two clients, and two people's clients, share a ``LocalCluster``'s GPUs: the
second's one task does not wait for the first's whole queue (``scheduler/shares.py``),
a quota holds, the status shows each share, and a stranger is refused in one line.

One worker process with ``GPU=2``; client A queues 30 tasks of 0.2 s asking
``GPU=1`` (3 s of work), then client B submits one. B's task starts at the next
freed GPU, about 0.2 s later, where first come, first served made it wait until
A's queue was empty. Checked on what happened: each task reports its wall-clock
span (one machine, one clock).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

from apportion import Client, LocalCluster
from apportion.net.person_token import person_token
from apportion.net.scheduler_file import write_scheduler_file
from apportion.net.security import AuthenticationError
from apportion.protocol.people import AddPerson, PersonAdded

pytestmark = [pytest.mark.process, pytest.mark.tcp]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TASKS = 30
SECONDS = 0.2


def timed_sleep(seconds: float, _: int) -> tuple[float, float]:
    start = time.time()
    threading.Event().wait(seconds)
    return start, time.time()


@pytest.mark.timeout(60)
def test_a_second_client_is_served_at_the_next_freed_gpu() -> None:
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=4,
            resources={"GPU": 2},
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as a,
        Client(cluster) as b,
    ):
        spans = a.map(timed_sleep, [SECONDS] * TASKS, range(TASKS), resources={"GPU": 1})
        deadline = time.monotonic() + 20
        while sum(len(keys) for keys in a.processing().values()) < 2:
            assert time.monotonic() < deadline, "A's first tasks never started"
            time.sleep(0.01)
        # A's first two tasks are running, the rest wait.
        submitted = time.time()
        start, _ = b.submit(timed_sleep, SECONDS, -1, resources={"GPU": 1}).result(timeout=30)
        a_spans = a.gather(spans)
        last_end = max(end for _, end in a_spans)
        # At the next freed GPU (0.2 s), with room for a loaded 2-core machine; A's
        # queue keeps the cluster busy until about 3 s.
        assert start - submitted < 1.0, f"B waited {start - submitted:.2f} s"
        assert start < last_end - 1.5, "B's task ran only once A's queue emptied"
        # Never more than the two GPUs at once, whoever's.
        spans_all = [*a_spans, (start, start + SECONDS)]
        for t, _ in spans_all:
            assert sum(1 for s, e in spans_all if s <= t < e) <= 2


def _admit(owner: Client, name: str, quota: str, path: Path) -> Path:
    """The owner admits ``name``; their credential file, as ``apportion user add`` writes it."""
    added = owner._link.connected.call(lambda rid: AddPerson(rid, name, 1.0, quota), 20)
    assert isinstance(added, PersonAdded) and not added.error, added
    write_scheduler_file(path, owner.scheduler_info()["address"], added.token, f"p-{name}", pid=0)
    return path


@pytest.mark.timeout(90)
def test_two_people_s_clients_share_a_local_cluster_fairly_and_a_stranger_is_refused(
    tmp_path: Path,
) -> None:
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=4,
            resources={"GPU": 2},
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as owner,
    ):
        alice_file = _admit(owner, "alice", "", tmp_path / "alice.json")
        bob_file = _admit(owner, "bob", "GPU=1", tmp_path / "bob.json")

        # A stranger: alice's name with a made-up secret, and a name nobody admitted.
        for who in ("alice", "mallory"):
            forged = tmp_path / f"forged-{who}.json"
            address = owner.scheduler_info()["address"]
            write_scheduler_file(forged, address, person_token(who, "0" * 64), "x", pid=0)
            with pytest.raises(AuthenticationError) as refused:
                Client(scheduler_file=forged, timeout=5)
            text = str(refused.value)
            assert "\n" not in text, text
            assert f"does not know the secret this side holds for {who} (from {forged})" in text
            assert "ask the cluster's owner for a new one" in text

        with (
            Client(scheduler_file=alice_file, timeout=20) as alice,
            Client(scheduler_file=bob_file, timeout=20) as bob,
        ):
            spans = alice.map(timed_sleep, [SECONDS] * TASKS, range(TASKS), resources={"GPU": 1})
            deadline = time.monotonic() + 20
            while sum(len(keys) for keys in alice.processing().values()) < 2:
                assert time.monotonic() < deadline, "alice's first tasks never started"
                time.sleep(0.01)
            submitted = time.time()
            # Bob's two tasks: the first at the next freed GPU, the second held by his quota.
            first, second = bob.map(timed_sleep, [SECONDS, SECONDS], [-1, -2], resources={"GPU": 1})
            deadline = time.monotonic() + 10
            while True:
                rows = {row["share"]: row for row in owner.cluster_status()["shares"]}
                if rows["bob"]["held"].get("GPU") == 1.0:
                    break
                assert time.monotonic() < deadline, f"bob never held a GPU: {rows}"
                time.sleep(0.02)
            # The owner sees both people's shares; bob's second task is held by his quota.
            assert rows["alice"]["held"]["GPU"] == 1.0 and rows["alice"]["kind"] == "person"
            assert rows["bob"]["quota"] == {"GPU": 1.0} and rows["alice"]["fair"] == 0.5
            assert rows["bob"]["quota_holds"] == {"count": 1, "resources": {"GPU": 1.0}}
            # Each person sees their own share only.
            assert [row["share"] for row in bob.cluster_status()["shares"]] == ["bob"]
            assert [row["share"] for row in alice.cluster_status()["shares"]] == ["alice"]
            start, _ = first.result(timeout=30)
            second.result(timeout=30)
            a_spans = alice.gather(spans)
            last_end = max(end for _, end in a_spans)
            assert start - submitted < 1.0, f"bob waited {start - submitted:.2f} s"
            assert start < last_end - 1.5, "bob's task ran only once alice's queue emptied"
