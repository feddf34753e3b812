"""What a person may ask of the scheduler: their own work, never another's.

Every message from a client acting as a person (``ClientRecord.person``, not the
owner) passes here before its handler (``dispatch.py``); the owner's never do. Each
message is let through as it is, let through narrowed to what is the person's, or
refused in one line (``NotPermitted`` for a request, a failed key for a submission).

A task is the person's whose ``TaskRecord.person`` is theirs: set by the client that
submitted it first. So a person:

- submits tasks, but not under a key another person's task holds, nor on another's
  results as inputs;
- gathers, asks where (``who_has``), why, the story, sizes and recipe of their own
  keys only, and is refused for any other; cancels and retries their own keys only
  (others are left out); results always come relayed by the scheduler, never from
  a worker's data port, which a person's credential does not open;
- asks the job queue (``SubmitRuns``, ``QueryRuns``, ``CancelRuns``), which is told
  who asks and serves them their own runs only;
- may not do what the owner alone may: admit or remove people, restart the
  cluster, run or install code on every worker, read the scheduler's logs or dump,
  serve others' requests (``RegisterService``), move data between workers.

Their status is narrowed to their own work where it is built (``people_view.py``),
as are who holds what, the sizes of results and the datasets (``shared_data.py``).

A person's locks, semaphores, events, variables and queues live in a namespace of
their own (``own_name``): the names they use are rewritten here, so that nobody
else's can be reached, nor theirs by anyone but the owner.

Not narrowed yet, and said so in docs/security.md: the waiting work by kind of
request (``BacklogRequest``: counts, no keys), metadata and topics (``Subscribe``,
``Publish``), whose names are shared by everyone, and the prints and warnings tasks
send.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from apportion.protocol.base import Message
from apportion.protocol.cluster import (
    DumpRequest,
    LogsRequest,
    NbytesRequest,
    RestartRequest,
    StoryRequest,
    WhyReply,
    WhyRequest,
)
from apportion.protocol.coordination import EventRequest, LeaseRequest, ValueRequest
from apportion.protocol.people import AddPerson, ListPeople, NotPermitted, RemovePerson
from apportion.protocol.remote_calls import CallOnWorkers, InstallOnWorkers, UninstallFromWorkers
from apportion.protocol.services import AdoptTask, ForwardedReply, RegisterService, StopTasks
from apportion.protocol.shared_data import RebalanceKeys, ReplicateKeys
from apportion.protocol.tasks import (
    CancelKeys,
    FireAndForget,
    GatherRequest,
    RecipeRequest,
    RetryKeys,
    ScatterPlaced,
    ScatterRequest,
    SubmitTasks,
    WhoHasRequest,
)
from apportion.scheduler.client_requests import WHY_ALL_LIMIT
from apportion.scheduler.events import SendKeysFailed
from apportion.scheduler.records import QUEUED, WAITING, ClientRecord
from apportion.scheduler.state import SchedulerState

#: What only the owner may ask.
OWNER_ONLY: frozenset[type[Message]] = frozenset(
    {
        AddPerson,
        RemovePerson,
        ListPeople,
        RestartRequest,
        DumpRequest,
        LogsRequest,
        CallOnWorkers,
        InstallOnWorkers,
        UninstallFromWorkers,
        RegisterService,
        ForwardedReply,
        AdoptTask,
        StopTasks,
        ReplicateKeys,
        RebalanceKeys,
        ScatterPlaced,
    }
)

#: Requests naming keys that are all answered about: refused whole if one is not theirs.
ASKING: frozenset[type[Message]] = frozenset(
    {GatherRequest, WhoHasRequest, NbytesRequest, RecipeRequest}
)

#: Requests naming keys to act on: narrowed to theirs.
ACTING: frozenset[type[Message]] = frozenset({CancelKeys, RetryKeys, FireAndForget})

#: The job queue's requests a person may make (by class name: the scheduler does not
#: know the job queue's messages, it forwards them, saying who asks).
FORWARDED_TO_PEOPLE = frozenset({"SubmitRuns", "QueryRuns", "CancelRuns"})

#: A gather's ``direct_from`` that nothing reaches: every result relayed.
RELAY_ALL = 1 << 62


def admit(state: SchedulerState, client: ClientRecord, messages: list[Message]) -> list[Message]:
    """The messages of person ``client`` to handle, each as the module docstring says;
    the refused ones are answered here."""
    out: list[Message] = []
    for msg in messages:
        kept = _admit_one(state, client, msg)
        if kept is not None:
            out.append(kept)
    return out


def _admit_one(state: SchedulerState, client: ClientRecord, msg: Message) -> Message | None:
    kind = type(msg)
    if kind in OWNER_ONLY:
        return _refused(state, client, msg, f"only the cluster's owner may send {kind.__name__}")
    handler = _NARROW.get(kind)
    if handler is not None:
        return handler(state, client, msg)
    if kind in ASKING:
        keys: list[str] = getattr(msg, "keys", [])
        foreign = _not_theirs(state, client, keys)
        if foreign:
            return _refused(state, client, msg, _foreign_text(client, foreign))
        if isinstance(msg, GatherRequest):
            return dataclasses.replace(msg, direct_from=RELAY_ALL)
        return msg
    if kind in ACTING:
        keys = getattr(msg, "keys", [])
        mine = [k for k in keys if _theirs(state, client, k)]
        return dataclasses.replace(msg, keys=mine)  # type: ignore[type-var]
    if kind.__module__.startswith("apportion.protocol."):
        return msg  # the engine's own requests, not about anyone's keys
    if kind.__name__ in FORWARDED_TO_PEOPLE:
        return msg  # the job queue is told who asks (``task_hooks.forward``)
    return _refused(state, client, msg, f"only the cluster's owner may send {kind.__name__}")


def _theirs(state: SchedulerState, client: ClientRecord, key: str) -> bool:
    """Whether ``key`` is the person's own (a key nobody holds is nobody's: theirs)."""
    task = state.tasks.get(key)
    return task is None or task.person == client.person


def _not_theirs(state: SchedulerState, client: ClientRecord, keys: Iterable[str]) -> list[str]:
    return [key for key in keys if not _theirs(state, client, key)]


def _foreign_text(client: ClientRecord, keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:3]) + (" ..." if len(keys) > 3 else "")
    return f"{client.person} may not use another person's tasks: {shown}"


def _refused(
    state: SchedulerState, client: ClientRecord, msg: Message, reason: str
) -> Message | None:
    """Answer a refused request in one line; a message that is no request is dropped
    with a warning, as an unexpected one is. None: nothing of it is handled."""
    request_id = getattr(msg, "request_id", None)
    if isinstance(request_id, int):
        state.reply(client.id, NotPermitted(request_id, reason))
    else:
        state.warn(f"client {client.id} ({client.person}): {reason}; ignored")
    return None


def _submit(state: SchedulerState, client: ClientRecord, msg: SubmitTasks) -> Message | None:
    """Their submission, unless it names another's key (as its own, as an input or as
    one to want): then none of it is taken, and every key it wants fails saying why."""
    named = [spec.key for spec in msg.tasks]
    named += [dep for spec in msg.tasks for dep in spec.deps]
    foreign = _not_theirs(state, client, [*named, *msg.wanted])
    if not foreign:
        return msg
    text = _foreign_text(client, sorted(set(foreign)))
    wanted = msg.wanted or [spec.key for spec in msg.tasks]
    state.emit(SendKeysFailed(client.id, wanted, "lost", text))
    return None


def _scatter(state: SchedulerState, client: ClientRecord, msg: ScatterRequest) -> Message | None:
    foreign = _not_theirs(state, client, msg.data)
    if foreign:
        return _refused(state, client, msg, _foreign_text(client, foreign))
    return msg


def _why(state: SchedulerState, client: ClientRecord, msg: WhyRequest) -> Message | None:
    """Their keys explained; asked about none, their own waiting tasks (not everyone's)."""
    foreign = _not_theirs(state, client, msg.keys)
    if foreign:
        return _refused(state, client, msg, _foreign_text(client, foreign))
    if msg.keys:
        return msg
    own = [
        key
        for key, task in state.tasks.items()
        if task.person == client.person and task.state in (WAITING, QUEUED)
    ]
    if not own:
        state.reply(client.id, WhyReply(msg.request_id, {}))
        return None
    return WhyRequest(msg.request_id, own[:WHY_ALL_LIMIT])


def own_name(person: str, name: str) -> str:
    """Where a person's lock, semaphore, event, variable or queue named ``name`` lives:
    a namespace of their own (``alice/name``), which no other person can name (a
    person's name has no ``/``) and the owner reaches by that full name."""
    return f"{person}/{name}"


def _lease(state: SchedulerState, client: ClientRecord, msg: LeaseRequest) -> Message | None:
    names = [own_name(client.person, name) for name in msg.names]
    return dataclasses.replace(msg, names=names)


def _event(state: SchedulerState, client: ClientRecord, msg: EventRequest) -> Message | None:
    return dataclasses.replace(msg, name=own_name(client.person, msg.name))


def _value(state: SchedulerState, client: ClientRecord, msg: ValueRequest) -> Message | None:
    foreign = _not_theirs(state, client, msg.keys)
    if foreign:
        return _refused(state, client, msg, _foreign_text(client, foreign))
    return dataclasses.replace(msg, name=own_name(client.person, msg.name))


def _story(state: SchedulerState, client: ClientRecord, msg: StoryRequest) -> Message | None:
    if not _theirs(state, client, msg.key):
        return _refused(state, client, msg, _foreign_text(client, [msg.key]))
    return msg


_NARROW: dict[type[Message], Callable[[SchedulerState, ClientRecord, Any], Message | None]] = {
    SubmitTasks: _submit,
    ScatterRequest: _scatter,
    WhyRequest: _why,
    StoryRequest: _story,
    LeaseRequest: _lease,
    EventRequest: _event,
    ValueRequest: _value,
}
