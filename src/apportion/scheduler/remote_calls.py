"""Code run on workers outside tasks: relayed calls, kept uploads and plugins, facts.

The scheduler runs no user code and unpickles no payload (DESIGN.md): a client's
``run`` arrives as opaque bytes, goes to each chosen worker as one ``SendRemoteCall``, and
the answers are collected in a ``RemoteBook`` entry until every worker has answered;
a worker that leaves first answers "lost", so a call never waits for the dead.

Uploaded files and worker plugins are kept here (as bytes, bounded in total) and
replayed in the order they came to every worker that joins, so that a worker
started later can import an upload as the first ones can.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apportion.protocol.cluster import LogsReply, LogsRequest, VersionsReply, VersionsRequest
from apportion.protocol.remote_calls import (
    NO_REPLY,
    CallAnswered,
    CallOnWorkers,
    InstallOnWorkers,
    UninstallFromWorkers,
    WorkersAnswered,
)
from apportion.scheduler.books import MAX_KEPT_BYTES, Call
from apportion.scheduler.events import Installation, SendInstall, SendRemoteCall, SendUninstall
from apportion.scheduler.records import ClientRecord, WorkerRecord
from apportion.scheduler.state import SchedulerState

#: Largest upload or pickled plugin accepted, in bytes.
MAX_INSTALL_BYTES = 64 * 2**20

#: Install kinds a client may ask for.
KINDS = ("upload", "plugin")


# --- client requests ---------------------------------------------------------------


def run(state: SchedulerState, client: ClientRecord, msg: CallOnWorkers) -> None:
    """Send the call to the named workers (every worker when none is named)."""
    targets, unknown = _targets(state, msg.workers)
    if unknown:
        text = "no worker is named or listens at " + ", ".join(map(repr, unknown))
        _refuse(state, client, msg.request_id, text)
        return
    _start(
        state,
        client.id,
        msg.request_id,
        targets,
        lambda worker_id, rid: SendRemoteCall(worker_id, rid, msg.call),
    )


def install(state: SchedulerState, client: ClientRecord, msg: InstallOnWorkers) -> None:
    """Keep an upload or plugin for workers to come and send it to every worker now."""
    book = state.remote
    key = (msg.kind, msg.name)
    error = ""
    if msg.kind not in KINDS:
        error = f"unknown install kind {msg.kind!r}"
    elif len(msg.blob) > MAX_INSTALL_BYTES:
        error = (
            f"{msg.kind} {msg.name!r} is {len(msg.blob):,} bytes; the limit is "
            f"{MAX_INSTALL_BYTES:,}"
        )
    elif key in book.kept and not msg.replace:
        # Dask's ``idempotent``: what is installed stays; nothing to do anywhere.
        _reply(state, client.id, msg.request_id, {}, "")
        return
    else:
        old = book.kept.get(key)
        total = book.kept_bytes - (len(old.blob) if old else 0) + len(msg.blob)
        if total > MAX_KEPT_BYTES:
            error = (
                f"the scheduler keeps at most {MAX_KEPT_BYTES:,} bytes of uploads and "
                f"plugins; {msg.name!r} would make it {total:,}"
            )
    if error:
        _refuse(state, client, msg.request_id, error)
        return
    book.kept.pop(key, None)  # popped, so a replaced install moves to the end
    installation = book.kept[key] = Installation(msg.kind, msg.name, msg.blob, msg.load)
    every = {w.id: w.address for w in state.workers.values()}
    _start(
        state,
        client.id,
        msg.request_id,
        every,
        lambda worker_id, rid: SendInstall(worker_id, rid, installation),
    )


def uninstall(state: SchedulerState, client: ClientRecord, msg: UninstallFromWorkers) -> None:
    """Forget a plugin and have every worker tear it down."""
    if state.remote.kept.pop(("plugin", msg.name), None) is None:
        _refuse(state, client, msg.request_id, f"no worker plugin named {msg.name!r}")
        return
    every = {w.id: w.address for w in state.workers.values()}
    _start(
        state,
        client.id,
        msg.request_id,
        every,
        lambda worker_id, rid: SendUninstall(worker_id, rid, msg.name),
    )


def versions(state: SchedulerState, client: ClientRecord, msg: VersionsRequest) -> None:
    state.reply(client.id, VersionsReply(msg.request_id, state.remote.versions))


def logs(state: SchedulerState, client: ClientRecord, msg: LogsRequest) -> None:
    recent = state.remote.logs
    state.reply(client.id, LogsReply(msg.request_id, recent(msg.n) if recent else []))


# --- worker answers and membership -------------------------------------------------


def call_answered(state: SchedulerState, worker: WorkerRecord, msg: CallAnswered) -> None:
    call = state.remote.calls.get(msg.request_id)
    if call is None or worker.id not in call.pending:
        return  # nobody waits (no reply asked, client gone, or an earlier session's call)
    address = call.pending.pop(worker.id)
    call.results[address] = [msg.status, msg.value, msg.traceback]
    _maybe_finish(state, msg.request_id)


def worker_joined(state: SchedulerState, worker_id: str) -> None:
    """Replay every kept upload and plugin, in the order they came."""
    for kept in state.remote.kept.values():
        state.emit(SendInstall(worker_id, NO_REPLY, kept))


def worker_left(state: SchedulerState, worker_id: str, how: str) -> None:
    """The calls waiting for this worker get "lost" for it instead of waiting forever."""
    for rid, call in list(state.remote.calls.items()):
        address = call.pending.pop(worker_id, None)
        if address is not None:
            text = f"worker {address} left before answering: {how}"
            call.results[address] = ["lost", text.encode(), b""]
            _maybe_finish(state, rid)


# --- helpers -----------------------------------------------------------------------


def _targets(state: SchedulerState, wanted: list[str]) -> tuple[dict[str, str], list[str]]:
    """worker id -> address for the workers ``wanted`` names (all if empty); unknown names."""
    if not wanted:
        return {w.id: w.address for w in state.workers.values()}, []
    targets: dict[str, str] = {}
    unknown: list[str] = []
    for name in wanted:
        # By name, address (with or without scheme) or host, as ``workers=`` elsewhere.
        named = [w for w in state.workers.values() if name in w.aliases]
        if not named:
            unknown.append(name)
        targets.update((w.id, w.address) for w in named)
    return targets, unknown


def _start(
    state: SchedulerState,
    client_id: str,
    request_id: int,
    targets: dict[str, str],
    make: Callable[[str, int], SendRemoteCall | SendInstall | SendUninstall],
) -> None:
    """One command per target, ``make(worker id, request id)``; collect the answers if
    the client waits for them."""
    if request_id == NO_REPLY:
        for worker_id in targets:
            state.emit(make(worker_id, NO_REPLY))
        return
    rid = state.remote.new_id()
    state.remote.calls[rid] = Call(client_id, request_id, dict(targets))
    for worker_id in targets:
        state.emit(make(worker_id, rid))
    _maybe_finish(state, rid)


def _maybe_finish(state: SchedulerState, rid: int) -> None:
    call = state.remote.calls[rid]
    if not call.pending:
        del state.remote.calls[rid]
        _reply(state, call.client_id, call.request_id, call.results, "")


def _refuse(state: SchedulerState, client: ClientRecord, request_id: int, text: str) -> None:
    if request_id == NO_REPLY:
        state.warn(f"client {client.id}: {text}")
    else:
        _reply(state, client.id, request_id, {}, text)


def _reply(
    state: SchedulerState,
    client_id: str,
    request_id: int,
    results: dict[str, list[Any]],
    error: str,
) -> None:
    if client_id in state.clients:
        state.reply(client_id, WorkersAnswered(request_id, results, error))


def check_book(state: SchedulerState) -> None:
    """Invariants (``check_invariants``): a call waits only for connected workers and
    for a client still there; what is kept stays within its bound."""
    for rid, call in state.remote.calls.items():
        assert call.pending, f"call {rid} has nobody to wait for but was not answered"
        gone = set(call.pending) - set(state.workers)
        assert not gone, f"call {rid} waits for workers that left: {sorted(gone)}"
        assert call.client_id in state.clients, f"call {rid} is for a client that left"
    assert state.remote.kept_bytes <= MAX_KEPT_BYTES, "kept uploads and plugins above bound"
