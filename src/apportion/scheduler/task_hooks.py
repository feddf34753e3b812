"""Generic hooks that let a client serve others: notes, adoption, forwarded requests.

The job queue is such a client; the scheduler knows nothing of runs. What it offers
any client that registers as a service (``RegisterService``):

- *notes*: a worker's ``TaskNote`` about a running task goes, unread, to every
  client wanting the task's key (``TaskNoted``, naming the worker);
- *tasks still running*: a worker that joins with tasks alive from an earlier
  session (``RegisterWorker.live_tasks``) is announced to the service whose key
  prefix they bear (``TasksStillRunning``), which adopts them (``AdoptTask``: the
  task is assigned where it runs, not queued) or has them stopped (``StopTasks``);
  those no service claims are stopped at once (``FreeKeys``), as nobody wants them.
  The notes the worker sends about such a task before it is adopted (what it kept
  while no scheduler was up) are kept, and go to the service once it adopts it;
- *departures*: a service hears when the last worker of a name leaves
  (``WorkerDeparted``), once the event that removed it is over (a worker replaced by
  a new registration of its name has not departed);
- *requests*: a client's request of a kind the scheduler does not serve goes to the
  service registered for that kind (``ForwardedRequest``), whose answer is relayed
  (``ForwardedReply``); with no such service, the client is told (``Unserved``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apportion.protocol.base import Message
from apportion.protocol.codec import ProtocolError, decode_message, encode_message
from apportion.protocol.services import (
    AdoptTask,
    ForwardedReply,
    RegisterService,
    StopTasks,
    TaskNote,
    Unserved,
)
from apportion.protocol.tasks import SubmitTasks
from apportion.protocol.worker import RegisterWorker
from apportion.scheduler import client_requests
from apportion.scheduler.events import (
    SendForwardedRequest,
    SendFreeKeys,
    SendTaskNoted,
    SendTasksStillRunning,
    SendWorkerDeparted,
)
from apportion.scheduler.records import QUEUED, ClientRecord, WorkerRecord

if TYPE_CHECKING:
    from apportion.scheduler.state import SchedulerState


def register_service(state: SchedulerState, client: ClientRecord, msg: RegisterService) -> None:
    # A service's work outlives its connection (the job queue's runs keep running
    # while the scheduler stops, for the next one to adopt).
    client.durable = True
    for kind in msg.requests:
        state.services.requests[kind] = client.id
    if msg.key_prefix:
        state.services.prefixes[msg.key_prefix] = client.id


def forward(state: SchedulerState, peer: ClientRecord | WorkerRecord, msg: Message) -> bool:
    """Forward a client's request to the service serving its kind; whether there is one.

    If there is none the client is told so (``Unserved``), not left waiting.
    """
    if not isinstance(peer, ClientRecord):
        return False
    kind = type(msg).__name__
    server = state.services.requests.get(kind)
    if server is None or server not in state.clients:
        state.reply(peer.id, Unserved(kind))
        return False
    state.emit(SendForwardedRequest(server, peer.id, encode_message(msg), peer.person))
    return True


def forwarded_reply(state: SchedulerState, client: ClientRecord, msg: ForwardedReply) -> None:
    if msg.origin not in state.clients:
        return  # the asker left meanwhile
    try:
        reply = decode_message(msg.reply)
    except ProtocolError as exc:
        state.warn(f"client {client.id} sent a garbled reply for {msg.origin}: {exc}")
        return
    state.reply(msg.origin, reply)


def task_note(state: SchedulerState, worker: WorkerRecord, msg: TaskNote) -> None:
    task = state.tasks.get(msg.key)
    if task is None and state.services.unadopted:
        kept = state.services.unadopted.get((worker.id, msg.key))
        if kept is not None:
            kept.append(msg.note)  # for the service, once it adopts the task
            return
    if task is None or not task.wanted_by:
        return  # nobody to tell
    for client_id in task.wanted_by:
        state.emit(SendTaskNoted(client_id, msg.key, worker.name, msg.note))


def worker_joined(state: SchedulerState, worker_id: str, reg: RegisterWorker) -> None:
    """Offer the tasks still running on a worker that joined to the services claiming them."""
    if not reg.live_tasks:
        return
    offers: dict[str, list[str]] = {}
    unclaimed: list[str] = []
    for key in reg.live_tasks:
        server = server_of(state, key)
        if server is None:
            unclaimed.append(key)
        else:
            offers.setdefault(server, []).append(key)
    for server, keys in offers.items():
        states = {key: task.state for key in keys if (task := state.tasks.get(key)) is not None}
        for key in keys:
            if key not in states:
                state.services.unadopted[(worker_id, key)] = []
        state.emit(SendTasksStillRunning(server, worker_id, reg.name, keys, states))
    if unclaimed:
        state.emit(SendFreeKeys(worker_id, unclaimed))  # nobody here will ever want them


def server_of(state: SchedulerState, key: str) -> str | None:
    """The service that claims ``key`` by its prefix (the job queue, a run's task)."""
    for prefix, client_id in state.services.prefixes.items():
        if key.startswith(prefix) and client_id in state.clients:
            return client_id
    return None


def adopt_task(state: SchedulerState, client: ClientRecord, msg: AdoptTask) -> None:
    key = msg.task.key
    kept = state.services.unadopted.pop((msg.worker_id, key), None)
    client_requests.submit(state, client, SubmitTasks([msg.task], msg.functions, [key]))
    worker = state.workers.get(msg.worker_id)
    task = state.tasks.get(key)
    if task is not None and kept and worker is not None:
        # What the worker said of it before this adoption: its output and end are
        # the service's to record, whether or not the task can be adopted there.
        for note in kept:
            for client_id in task.wanted_by or ():
                state.emit(SendTaskNoted(client_id, key, worker.name, note))
    if task is None or task.state != QUEUED or task.reserved_on is not None:
        return
    if worker is None or worker.leaving is not None or not worker.ledger.fits(task.resources):
        state.warn(f"{key} cannot be adopted where it runs; it will run again")
        return
    state.assign(task, worker, msg.units, f"adopted: still running on {worker.name}")
    worker.started.add(task.key)  # its processes run: never to be moved


def stop_tasks(state: SchedulerState, client: ClientRecord, msg: StopTasks) -> None:
    for key in msg.keys:
        state.services.unadopted.pop((msg.worker_id, key), None)
    if msg.worker_id in state.workers:
        state.emit(SendFreeKeys(msg.worker_id, msg.keys))


def worker_left(state: SchedulerState, worker: WorkerRecord) -> None:
    if state.services.unadopted:
        for pair in [pair for pair in state.services.unadopted if pair[0] == worker.id]:
            del state.services.unadopted[pair]
    if state.services.prefixes:
        state.services.departed.append(worker.name)


def flush(state: SchedulerState) -> None:
    """At the end of an event: tell services of workers whose name nobody holds now."""
    book = state.services
    if not book.departed:
        return
    names = {w.name for w in state.workers.values()}
    servers = {c for c in book.prefixes.values() if c in state.clients}
    for name in book.departed:
        if name not in names:
            for server in sorted(servers):
                state.emit(SendWorkerDeparted(server, name))
    book.departed.clear()
