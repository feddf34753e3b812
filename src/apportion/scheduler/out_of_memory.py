"""Results too large for their workers' memory: the verdict that fails them.

The worker that computed a result says it is too large (``ResultTooLarge``): the
value alone was above what the worker keeps (``MemoryLimits.largest_result``), and
was dropped. The task fails with kind ``"memory"`` (``OutOfMemoryError`` on the
client, a ``MemoryError``), saying out of memory, the result's size and the
worker's limit, instead of killing worker after worker and ending as lost data.
Retries do not apply: running it again makes a result of the same size.
"""

from __future__ import annotations

from apportion.core.sizes import format_bytes
from apportion.protocol import messages as m
from apportion.scheduler import worker_reports
from apportion.scheduler.core import SchedulerCore
from apportion.scheduler.records import WorkerRecord

#: What to do about a result too large for its workers, in every such error.
ADVICE = (
    "Run it on workers with more memory (apportion worker --memory-limit, "
    "LocalCluster(memory_limit=...)), or split the result into smaller pieces."
)


# --- the worker's verdict ----------------------------------------------------------


def result_too_large(state: SchedulerCore, worker: WorkerRecord, msg: m.ResultTooLarge) -> None:
    """The worker dropped the result as too large to keep: the task fails."""
    task = worker_reports.running_task(state, worker, msg.key)
    if task is None:
        return
    state.placement_due = True
    if task.discard_result:
        worker_reports.settle_discarded(state, task, f"too large on {worker.name}, discarded")
        return
    kills = (
        f", and it is killed above {format_bytes(msg.largest)}" if msg.largest < msg.limit else ""
    )
    text = (
        f"out of memory: the result of {msg.key!r} ({msg.type_name} of "
        f"{format_bytes(msg.nbytes)}) is too large for worker {worker.name}: its memory "
        f"limit is {format_bytes(msg.limit)}{kills}. The result was dropped. {ADVICE}"
    )
    state.fail(task, ("memory", text, b""), f"result too large for {worker.name}")
