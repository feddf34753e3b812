"""Task throughput on a scheduler serving a journal, quiet and beside a chatty run.

One run's output must not stall scheduling for everyone. A scheduler serving a
journal and 2 workers of 2 threads each run as ``apportion`` processes over loopback
TCP (``queue_throughput._cluster``). One run is submitted first and holds one thread:
in the *quiet* round it sleeps, printing nothing; in the *chatty* round it prints
``--megabytes`` (50 MB) to stdout as fast as it can. Each of ``--repeat`` times a
fresh run is submitted and, as soon as the journal says it started, the throughput
benchmark's independent workload (10,000 no-op tasks, ``map`` then ``gather``) is
timed; the median tasks per second of each round is printed. Each repetition also
prints how much output the run's log held when the workload was done. A third,
*busy* round pipes the chatty program's output to ``cat > /dev/null``: on a
machine with few cores the command and a reader of its pipe slow everything by
themselves, and chatty/busy shows what carrying its output to the log costs beyond.

The three rounds run in two layouts. *Shared*: every process may use every core.
*Own core* (Linux, 2 cores or more): the run's command is pinned to the last core and
the cluster (scheduler, workers, this client) to the others, as a run would have the
core it asked for on a machine with enough of them; there chatty/quiet is what
carrying the output costs everyone else, without the command's own printing competing
with the cluster for a core.

Usage: ``python benchmarks/chatty_run.py [--repeat N] [--megabytes M]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from apportion import Client
from apportion.runs import remote
from apportion.runs.journal import FINISHED, QUEUED, Journal
from apportion.runs.spec import RunSpec, new_spec
from harness import settle_apportion, wait_until
from queue_throughput import _cluster
from throughput import N_INDEPENDENT, independent, warm_up

N_WORKERS = 2
N_THREADS = 2
REPEAT = 3
MEGABYTES = 50

#: The chatty run: ``MB`` megabytes of text lines, then it ends.
_CHATTY = (
    "import sys\n"
    "line = b'x' * 99 + b'\\n'\n"
    "out = sys.stdout.buffer\n"
    "for _ in range({mb} * 10_000):\n"
    "    out.write(line)\n"
    "out.flush()\n"
)

#: Runs argv[1:] pinned to the cores listed in argv[1] (comma-separated).
_PINNED = (
    "import os, sys\n"
    "os.sched_setaffinity(0, map(int, sys.argv[1].split(',')))\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def own_core_layout() -> tuple[set[int], int] | None:
    """(the cluster's cores, the run's core) for the own-core layout, or None here."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    return set(cores[:-1]), cores[-1]


@contextmanager
def pinned(cores: set[int] | None) -> Iterator[None]:
    """This process (and so the cluster it starts) on ``cores`` meanwhile; None: as is."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def round_tasks_per_second(
    kind: str, repeat: int, megabytes: int, layout: tuple[set[int], int] | None
) -> list[float]:
    """Tasks/s of the independent workload, each time beside a run just started; with a
    ``layout``, the cluster on its cores and the run on its own."""
    with tempfile.TemporaryDirectory(prefix="apportion-chatty-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        cluster_cores = layout[0] if layout else None
        with pinned(cluster_cores), _cluster(base, N_WORKERS, N_THREADS) as address:
            journal = Journal(base / "runs.db")
            client = Client(address)
            try:
                warm_up(client)
                program = _CHATTY.format(mb=megabytes)
                command = {
                    "quiet": ["sleep", "600"],
                    "chatty": [sys.executable, "-c", program],
                    # The same output through a pipe to ``cat``, thrown away there: what
                    # the command and a pipe reader alone cost the machine.
                    "busy": ["sh", "-c", '"$0" -c "$1" | cat > /dev/null', sys.executable, program],
                }[kind]
                if layout is not None:
                    command = [sys.executable, "-c", _PINNED, str(layout[1]), *command]
                spec = new_spec(command, cwd=tmp)
                stop = kind == "quiet"
                return [beside_run(client, journal, spec, stop=stop) for _ in range(repeat)]
            finally:
                client.close()
                journal.close()


def beside_run(client: Client, journal: Journal, spec: RunSpec, *, stop: bool) -> float:
    """Tasks/s of the workload timed from the start of a fresh run of ``spec``."""
    settle_apportion(client)
    [run_id] = remote.submit(client.scheduler_address, [spec]).ids
    wait_until(lambda: _state(journal, run_id) != QUEUED, "the run did not start", 60.0)
    start = time.perf_counter()
    rate = independent(client) / (time.perf_counter() - start)
    log = journal.log_path(run_id)
    size = log.stat().st_size if log.exists() else 0
    print(f"    {rate:>10,.0f} tasks/s, log {size / 1e6:.1f} MB", flush=True)
    if stop:
        remote.cancel(client.scheduler_address, [run_id])
    wait_until(lambda: _state(journal, run_id) in FINISHED, "the run did not end", 120.0)
    return rate


def _state(journal: Journal, run_id: int) -> str:
    record = journal.get(run_id)
    assert record is not None, "the run vanished from the journal"
    return record.state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=REPEAT, help="timed runs per round")
    parser.add_argument("--megabytes", type=int, default=MEGABYTES, help="chatty run output")
    args = parser.parse_args()
    print(
        f"{N_INDEPENDENT:,} no-op tasks on {N_WORKERS} workers x {N_THREADS} threads, "
        f"scheduler serving a journal (median of {args.repeat})",
        flush=True,
    )
    print("shared cores:", flush=True)
    report(args.repeat, args.megabytes, None)
    own_core = own_core_layout()
    if own_core is None:
        print("run on its own core: skipped, needs Linux and 2 cores or more", flush=True)
    else:
        print(f"run on its own core (core {own_core[1]}; the cluster on the others):", flush=True)
        report(args.repeat, args.megabytes, own_core)


def report(repeat: int, mb: int, layout: tuple[set[int], int] | None) -> None:
    """The three rounds in one layout, and their ratios."""
    figures = {}
    for kind, beside in (
        ("quiet", "a run printing nothing"),
        ("busy", f"a run piping {mb} MB to cat > /dev/null"),
        ("chatty", f"a run printing {mb} MB"),
    ):
        figures[kind] = statistics.median(round_tasks_per_second(kind, repeat, mb, layout))
        print(f"  {kind:<6}: {figures[kind]:>10,.0f} tasks/s  (beside {beside})", flush=True)
    quiet, busy, chatty = figures["quiet"], figures["busy"], figures["chatty"]
    print(f"  chatty/quiet: {chatty / quiet:.2f}   chatty/busy: {chatty / busy:.2f}", flush=True)


if __name__ == "__main__":
    main()
