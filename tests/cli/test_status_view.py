"""What ``apportion status`` prints, from statuses built over a recorded cluster: no
network, no terminal."""

from __future__ import annotations

import re
from typing import Any

import pytest

from apportion.cli.status_view import Style, ago, bar, fit_height, render, short_key
from apportion.protocol.people import AddPerson
from apportion.protocol.tasks import KeysDone, KeysFailed, Notice, TaskErred
from apportion.scheduler.state import SchedulerConfig
from apportion.scheduler.status import status
from apportion.testing import RecordingCluster

TRAIN = "train-" + "a" * 32
WIDE = Style(width=1000)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _busy_cluster() -> dict[str, Any]:
    """One worker with 4 GPUs, two held by a task; a request that waits for a GPU and
    one for 8, which no worker can ever meet."""
    sim = RecordingCluster(SchedulerConfig())
    sim.add_client("c1")
    sim.allow(Notice, KeysDone, TaskErred, KeysFailed)
    sim.add_worker("gpubox", nthreads=2, resources="gpu=[0,1,2,3] MEMORY=16GiB")
    sim.submit(TRAIN, resources="gpu=2 MEMORY=4GiB")
    sim.submit("other-" + "b" * 32, resources="gpu=2")
    sim.submit("waits", resources="gpu=1")
    sim.submit("('huge-" + "c" * 32 + "', 0)", resources="gpu=8")
    sim.place()
    return status(sim.state)


def test_each_unit_shows_the_task_holding_it_and_byte_pools_read_as_gib() -> None:
    lines = render(_busy_cluster(), style=WIDE)
    (gpu,) = [line for line in lines if line.strip().startswith("gpu") and "0:" in line]
    assert gpu.strip() == "gpu    [■■■■] 4/4  0:train-aaaa 1:train-aaaa 2:other-bbbb 3:other-bbbb"
    (memory,) = [line for line in lines if "held by" in line]
    assert "MEMORY [■■□□□□□□□□] 4 GiB/16 GiB  held by train-aaaa" in memory
    assert lines[0] == "scheduler ?: 1 worker, 2 threads, 1 client"
    assert lines[1] == "tasks: 2 processing, 2 queued"


def test_requests_no_worker_can_meet_come_first_with_the_reason() -> None:
    lines = render(_busy_cluster(), style=WIDE)
    start = lines.index("waiting (2 kinds of request)")
    assert lines[start + 1] == "  UNSATISFIABLE: 1 task needs gpu=8  oldest huge-cccc[0]"
    assert "no connected worker can ever provide" in lines[start + 2]
    assert lines[start + 3] == "  1 task needs gpu=1  oldest waits"
    warnings = lines[lines.index("warnings") + 1 :]
    assert warnings and "0 s ago" in warnings[0] and "needs gpu=8" in warnings[0]


def test_a_narrow_terminal_cuts_every_line_and_colour_counts_no_columns() -> None:
    plain = render(_busy_cluster(), style=Style(width=30))
    assert all(len(line) <= 30 for line in plain)
    assert any(line.endswith("…") for line in plain)
    assert not any(ANSI.search(line) for line in plain)
    coloured = render(_busy_cluster(), style=Style(width=30, colour=True))
    assert any(ANSI.search(line) for line in coloured)
    assert [ANSI.sub("", line) for line in coloured] == plain
    ascii_only = render(_busy_cluster(), style=Style(width=30, unicode=False))
    assert all(line.isascii() for line in ascii_only)


def test_runs_and_arrays_show_their_progress() -> None:
    counts = dict.fromkeys(["staged", "queued", "running", "completed", "failed"], 0)
    runs = {
        "journal": "/j/runs.db",
        "counts": {**counts, "completed": 5, "failed": 2, "running": 3, "queued": 10},
        "arrays": [{"id": 8, "name": "sweep", "counts": {**counts, "completed": 1, "queued": 3}}],
    }
    lines = render(_busy_cluster(), runs, style=WIDE)
    start = lines.index("runs (/j/runs.db)")
    assert lines[start + 1] == (
        "  [■■■■□□□□□□] 7/20 done  5 completed, 2 failed, 3 running, 10 queued"
    )
    assert lines[start + 2] == "  array 8 sweep  [■■□□□□□□□□] 1/4 done  1 completed, 3 queued"
    assert not any(line.startswith("runs") for line in render(_busy_cluster(), None))


@pytest.mark.parametrize(
    ("used", "total", "cells", "drawn"),
    [(0, 4, 4, "[□□□□]"), (0.1, 100, 4, "[■□□□]"), (99, 100, 4, "[■■■□]"), (4, 4, 4, "[■■■■]")],
)
def test_any_use_shows_and_only_a_full_pool_fills_the_bar(
    used: float, total: float, cells: int, drawn: str
) -> None:
    assert bar(used, total, cells) == drawn


def test_small_helpers() -> None:
    assert short_key("('sum-aggregate-9c1d2e3f4a5b6c7d', 3)") == "sum-aggregate-9c1d[3]"
    assert short_key("x" * 40, 10) == "xxxxxxxxx…"
    assert (ago(12.7), ago(190), ago(7300)) == ("12 s ago", "3 min ago", "2 h ago")
    assert fit_height(["a", "b", "c"], 2) == ["a", "(2 more lines: enlarge the terminal)"]
    assert fit_height(["a"], 5) == ["a"]


def test_a_group_counts_cancelled_tasks_apart_from_failed_ones() -> None:
    found = _busy_cluster()
    live = dict.fromkeys(["waiting", "queued", "processing", "memory", "erred", "released"], 0)
    ends = {"done": 1, "failed": 0, "cancelled": 2}
    found["groups"] = [{"name": "run", **live, "processing": 1, "queued": 2, **ends}]
    (line,) = [line for line in render(found, style=WIDE) if line.startswith("  run ")]
    assert line == "  run [■■■■■□□□□□] 3/6 done  1 processing, 2 queued, 2 cancelled"


def _shared_cluster() -> dict[str, Any]:
    """alice (a person with a quota of one GPU) and the owner's client share 4 GPUs."""
    sim = RecordingCluster(SchedulerConfig())
    sim.add_client("c1")
    sim.client_says("c1", AddPerson(1, "alice", 1.0, "gpu=1"))
    sim.add_client("a1", person="alice")
    sim.add_worker("gpubox", nthreads=4, resources="gpu=[0,1,2,3]")
    for i in range(3):
        sim.submit(f"a-{i}", client="a1", resources="gpu=1")
    for i in range(5):
        sim.submit(f"o-{i}", resources="gpu=1")
    sim.place()
    return status(sim.state)


def test_shares_show_holdings_against_fair_share_and_what_the_quota_holds() -> None:
    lines = render(_shared_cluster(), style=WIDE)
    start = lines.index("shares")
    assert lines[start + 1 : start + 6] == [
        "  share  weight  holds            dominant  fair  quota",
        "  alice       1  gpu=1 threads=1  gpu 25%    50%  gpu=1",
        "  c1          1  gpu=3 threads=3  gpu 75%    50%  -",
        "  alice: 2 waiting (gpu=1 x2), held by quota gpu=1",
        "  c1: 2 waiting (gpu=1 x2)",
    ]
    assert lines[start + 6] == ""  # then the groups


def test_one_client_alone_shows_no_shares() -> None:
    assert "shares" not in render(_busy_cluster(), style=WIDE)
