"""The people the cluster's owner admits: adding, listing and removing them.

Handlers of ``AddPerson``, ``ListPeople`` and ``RemovePerson``, which only the owner
may send (``people_gate.py`` refuses them from anyone else). The registry is
``SchedulerState.people``; the service keeps it, with each person's secret, in its
people file (``SavePeople``) and makes the secret of a new one (``IssueCredential``):
the state never holds or makes a secret.

Removing a person ends their presence at once and their work soon:

- their clients are disconnected (so they release what they held, as any client
  leaving does), and their credential stops working;
- their tasks not finished are cancelled: queued and waiting ones never start;
  running ones finish on their worker's thread (Python cannot stop a thread), their
  results dropped and their resources given back when they end. Results of theirs
  already in memory that the owner holds futures for stay the owner's to release.

Their runs are the job queue's: ``apportion user remove`` cancels them there
(``CancelPersonRuns``): queued ones never start, running ones are stopped as
``apportion cancel`` stops them. Nobody else's work is touched.
"""

from __future__ import annotations

from apportion.core.people import Person, new_person
from apportion.core.resource_names import did_you_mean, misspelt
from apportion.protocol.people import (
    AddPerson,
    ListPeople,
    PeopleListed,
    PersonAdded,
    PersonRemoved,
    RemovePerson,
)
from apportion.scheduler import membership, task_hooks
from apportion.scheduler.events import (
    ClientLeft,
    Disconnect,
    IssueCredential,
    Log,
    SavePeople,
)
from apportion.scheduler.records import PROCESSING, QUEUED, WAITING, ClientRecord
from apportion.scheduler.shares import THREADS
from apportion.scheduler.state import SchedulerState
from apportion.scheduler.unsatisfiable import offered

#: The states of a task that is not over: what removing its person cancels.
UNFINISHED = (WAITING, QUEUED, PROCESSING)


def add_person(state: SchedulerState, client: ClientRecord, msg: AddPerson) -> None:
    """Admit a person: checked (a quota naming a slip of an offered resource is
    refused), stored, and their credential issued to the owner."""
    try:
        person = new_person(msg.name, msg.weight, msg.quota)
    except ValueError as exc:
        state.reply(client.id, PersonAdded(msg.request_id, msg.name, "", str(exc), ""))
        return
    slips = misspelt(person.quota, offered(state.workers.values()) | {THREADS})
    if slips:
        # A cap on a name no worker offers caps nothing: a slip (gpu for GPU) would
        # leave the person uncapped without a word, as it would fail a task.
        error = f"invalid quota: no connected worker offers {', '.join(slips)}: " + did_you_mean(
            slips
        )
        state.reply(client.id, PersonAdded(msg.request_id, msg.name, "", error, ""))
        return
    if person.name in state.people:
        error = f"{person.name} is already admitted (remove them first to issue a new credential)"
        state.reply(client.id, PersonAdded(msg.request_id, msg.name, "", error, ""))
        return
    state.people[person.name] = person
    admit_share(state, person)
    # The secret first: the people are kept with it.
    state.emit(IssueCredential(client.id, msg.request_id, person.name))
    _save(state)
    state.emit(Log("info", f"admitted {person.name} (weight {person.weight:g})"))


def admit_share(state: SchedulerState, person: Person) -> None:
    """``person``'s share in the fair division: their weight, and their quota as its
    hard caps (``shares.py``); every client of theirs is in it."""
    state.shares.set(person.name, person.weight, person.quota or None)


def list_people(state: SchedulerState, client: ClientRecord, msg: ListPeople) -> None:
    connected: dict[str, int] = {}
    for other in state.clients.values():
        connected[other.person] = connected.get(other.person, 0) + 1
    rows = [
        {**person.to_dict(), "clients": connected.get(name, 0)}
        for name, person in sorted(state.people.items())
    ]
    state.reply(client.id, PeopleListed(msg.request_id, rows))


def remove_person(state: SchedulerState, client: ClientRecord, msg: RemovePerson) -> None:
    """Remove a person, as the module docstring says."""
    name = msg.name
    if name not in state.people:
        error = f"nobody named {name!r} is admitted (`apportion user list` shows who is)"
        state.reply(client.id, PersonRemoved(msg.request_id, name, error, 0, 0))
        return
    del state.people[name]
    state.shares.set(name)  # back to a plain share: their work is going anyway
    _save(state)
    theirs = [c.id for c in state.clients.values() if c.person == name]
    # Their runs' tasks are the job queue's to end (``CancelPersonRuns``), so that
    # its journal says how each ended.
    unfinished = [
        task
        for task in state.tasks.values()
        if task.person == name
        and task.state in UNFINISHED
        and task_hooks.server_of(state, task.key) is None
    ]
    reason = f"person {name} was removed from the cluster"
    for client_id in theirs:
        membership.client_left(state, ClientLeft(client_id, state.now))
        state.emit(Disconnect(client_id, reason))
    # What leaving did not release (what the owner still wants, say) is cancelled.
    for task in unfinished:
        if task.key in state.tasks and task.state in UNFINISHED and not task.cancelled:
            text = f"{task.key!r} was cancelled: {reason}"
            state.fail(task, ("cancelled", text, b""), reason)
    state.emit(Log("info", f"{reason}: {len(theirs)} clients disconnected"))
    state.reply(client.id, PersonRemoved(msg.request_id, name, "", len(unfinished), len(theirs)))


def _save(state: SchedulerState) -> None:
    state.emit(SavePeople(tuple(state.people[name] for name in sorted(state.people))))
