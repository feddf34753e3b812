"""Client <-> scheduler: tasks and their results.

The client submits tasks, holds and releases their keys, gathers and scatters data
and asks where it is; the scheduler says what finished, failed or is being computed
again. Most of a client's traffic, and the hot path of ``submit``/``map``.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, NamedTuple

from apportion.core.payload import Pickled
from apportion.protocol.base import Message, message


class TaskSpec(NamedTuple):
    """One task as a client submits it."""

    key: str
    func_id: str  #: hash of the pickled function; its bytes travel once per batch
    args: Pickled  #: (args, kwargs) with dependencies as placeholders
    deps: list[str]
    #: What it asks for, in ticks (``core.demand.Demand.wire``): the first alternative;
    #: empty for plain tasks.
    resources: dict[str, int]
    priority: int  #: higher runs earlier, as in Dask
    retries: int
    #: Alternatives in order of preference (empty unless there are two or more; then
    #: ``resources`` is the first). The scheduler runs the first that fits now.
    alternatives: list[dict[str, int]] = []
    #: Dask's ``workers=``: addresses, names or hosts of the workers it may run on
    #: (empty: any worker).
    workers: list[str] = []
    #: 1 makes ``workers`` a preference (Dask's ``allow_other_workers``), 0 a hard
    #: restriction; an int because the wire has no booleans.
    allow_other_workers: int = 0
    #: 1: the result is an actor, an object that stays on its worker and takes method
    #: calls; the task's resources stay held until the actor is released.
    actor: int = 0
    #: The person whose work it is, when the owner's service submits it for them (the
    #: job queue, for a person's run); "" otherwise. Ignored from a person's client,
    #: whose tasks are always their own.
    person: str = ""
    #: 1: the scheduler may stop it to let another share in, and run it again
    #: (``scheduler/preemption.py``): a job-queue run submitted ``--preemptible``.
    #: Honoured only from a service (the job queue), never from a client's own
    #: ``submit``: Python tasks are never preempted. An int: the wire has no booleans.
    preemptible: int = 0


@message(9)
class SubmitTasks(Message):
    """New tasks and the keys whose results the client holds futures for."""

    tasks: list[TaskSpec]
    functions: dict[str, bytes]  #: func_id -> pickled function, only ids new to the batch
    wanted: list[str]

    @classmethod
    def from_fields(cls, values: list[Any]) -> Message:
        tasks, functions, wanted = values
        return cls([TaskSpec(*t) for t in tasks], functions, wanted)


@message(10)
class ReleaseKeys(Message):
    """The client dropped its futures for these keys."""

    keys: list[str]


@message(11)
class CancelKeys(Message):
    """Stop these tasks if they have not finished; dependents fail as cancelled."""

    keys: list[str]


@message(12)
class GatherRequest(Message):
    """Ask the scheduler for the results of ``keys``: relayed, or where to fetch them."""

    request_id: int
    keys: list[str]
    #: Results of this many bytes or more are not relayed: the reply names their
    #: holders and the client fetches them from the workers. 0: relay every result.
    direct_from: int = 0


@message(13)
class ScatterRequest(Message):
    """Place client data on workers; the client holds futures for the keys."""

    request_id: int
    data: dict[str, Pickled]
    #: Only on workers with one of these names, addresses or hosts; empty: any.
    #: While none is connected the request waits, as it does for no workers at all.
    workers: list[str] = field(default_factory=list)


@message(14)
class WhoHasRequest(Message):
    """Which worker data addresses hold each key (for ``direct_to_workers``)."""

    request_id: int
    keys: list[str]


@message(18)
class KeysDone(Message):
    """These keys now have results in the cluster."""

    keys: list[str]
    #: For each key, its result's type name (``module.QualifiedName``, "" if unknown):
    #: ``Future.type``. Plain text: nobody on the way imports or unpickles anything.
    types: list[str] = field(default_factory=list)


@message(19)
class TaskErred(Message):
    """A task raised. ``exception`` and ``traceback`` are pickled by the worker."""

    key: str
    exception: Pickled
    traceback: Pickled
    attempts: int  #: runs that raised, retries included; the exception is the last one


@message(20)
class KeysFailed(Message):
    """The scheduler itself failed these keys (no user exception to forward)."""

    keys: list[str]
    #: "unsatisfiable", "misnamed", "cancelled", "lost", "unserializable", "crashed", "memory"
    kind: str
    message: str


@message(21)
class GatherReply(Message):
    request_id: int
    data: dict[str, Pickled]
    missing: list[str]
    errors: dict[str, str]  #: key -> why its value could not be sent (e.g. unpicklable)
    #: Results left to fetch directly (``direct_from``): key -> its holders' data addresses.
    elsewhere: dict[str, list[str]] = field(default_factory=dict)


@message(22)
class ScatterReply(Message):
    request_id: int
    keys: list[str]


@message(23)
class WhoHasReply(Message):
    request_id: int
    who_has: dict[str, list[str]]


@message(27)
class Notice(Message):
    """A warning the client should show its user (e.g. a request nobody can meet)."""

    level: str
    text: str


@message(46)
class ScatterPlaced(Message):
    """Client -> scheduler: data this client put on workers' data ports directly."""

    request_id: int
    placed: dict[str, list[Any]]  #: key -> [worker data address, nbytes]


@message(48)
class KeysPending(Message):
    """Scheduler -> client: these results were lost and are being computed again.

    Futures go back to pending; a ``KeysDone`` (or a failure) follows.
    """

    keys: list[str]


@message(87)
class RetryKeys(Message):
    """Client -> scheduler: run these failed tasks again, with their failed inputs."""

    keys: list[str]


@message(119)
class FireAndForget(Message):
    """Client -> scheduler: run these tasks to the end even if no client wants them."""

    keys: list[str]


@message(124)
class RecipeRequest(Message):
    """Client -> scheduler: the recipe of a task, to run it in the client (Dask's
    ``recreate_task_locally``). With ``blame`` 1, ``keys`` are failed keys and the
    recipe is that of the task whose own run failed them (an input, maybe, or an
    input's input); with 0, of ``keys[0]`` itself."""

    request_id: int
    keys: list[str]
    blame: int


@message(125)
class TaskRecipe(Message):
    """The task ``key``'s pickled function and arguments, as the client sent them
    (the scheduler never opens them), and the keys whose values the arguments take.
    ``problem`` says, in words, why there is none (then the rest is empty)."""

    request_id: int
    key: str
    function: bytes
    args: Pickled
    deps: list[str]
    problem: str


@message(136)
class TaskPreempted(Message):
    """Scheduler -> the clients wanting a preemptible task: it is being stopped on
    ``worker`` to let another share in (``reason``), and will run again; not a failure."""

    key: str
    worker: str
    reason: str
