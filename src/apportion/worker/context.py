"""What a running task may ask about where it runs: its resources and its worker.

Thread-local because each of a worker's threads runs one task at a time, and two
workers may share a process (tests, ``LocalCluster`` in threads).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from apportion.core.allocation import Allocation
from apportion.core.resources import SCALE, Units, format_amount, format_resources

if TYPE_CHECKING:
    from apportion.protocol.base import Message
    from apportion.worker.events import Execute

#: The variable CUDA reads to choose devices: the one thing apportion knows about GPUs.
CUDA_VARIABLE = "CUDA_VISIBLE_DEVICES"
#: Every pool a task holds is also in ``APPORTION_RESOURCE_<NAME>`` for its processes.
RESOURCE_VARIABLE_PREFIX = "APPORTION_RESOURCE_"

_DECIMAL = re.compile(r"[0-9]+")
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")

_local = threading.local()


class LocalActor(Protocol):
    """An actor of the worker this thread runs on, as another of its actors calls it
    directly (``worker.actors``)."""

    @property
    def instance(self) -> Any: ...

    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(*args, **kwargs)`` on this thread as one call of the actor."""
        ...

    def submit(
        self, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """``func(*args, **kwargs)`` as one call of the actor, on its own thread."""
        ...


class ActorKeeper(Protocol):
    """Where an actor's constructor leaves its instance (``worker.actors.ActorHost``)."""

    def host(self, key: str, instance: Any, allocation: Allocation) -> None: ...

    def local(self, key: str) -> LocalActor | None: ...


class TaskWorker(Protocol):
    """What this module reads of the worker running a task. It is a
    ``worker.service.Worker``, which imports this module: ``get_worker`` there gives
    it to users under its own type."""

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def units(self) -> Units: ...

    @property
    def actors(self) -> ActorKeeper: ...

    def send_threadsafe(self, message: Message) -> None:
        """Send to the scheduler from the task's thread, ahead of the task's outcome."""
        ...


class Seceding(Protocol):
    """What runs the task's thread: it lends the thread out while the task waits."""

    def secede(self, key: str, keep_resources: bool) -> None: ...

    def rejoin(self, key: str) -> None: ...


@dataclass(slots=True)
class _Running:
    """The task this thread runs: where, and what it holds (ticks; labels as text)."""

    worker: TaskWorker
    key: str
    allocation: Allocation
    #: Set when the scheduler no longer wants the result; or what makes that event
    #: on first use (``task_cancel_event``): most tasks never ask for it, and an
    #: event per tiny task costs as much as running it.
    cancel: threading.Event | Callable[[], threading.Event]
    runner: Seceding | None = None
    #: It called ``secede`` and has not rejoined: its thread does not count.
    seceded: bool = False
    #: A call on the actor of ``key`` (not a task): its calls to actors of this same
    #: worker run directly (``local_actor``).
    actor: bool = False


class running_task:  # lower case: used as a function, ``with running_task(...)``
    """Within this block, this thread runs ``command`` on ``worker``.

    ``command.allocation.units`` names the labels held of each indexed pool; its
    ``resources`` still has an amount for those pools, which ``task_resources`` then
    leaves out.
    ``cancel`` is set when the scheduler no longer wants the result (or makes that
    event when first asked for). A class, not a generator: it wraps every task.
    """

    __slots__ = ("_previous", "_running")

    def __init__(
        self,
        worker: TaskWorker,
        command: Execute,
        cancel: threading.Event | Callable[[], threading.Event],
        runner: Seceding | None = None,
    ) -> None:
        self._running = _Running(worker, command.key, command.allocation, cancel, runner)
        self._previous: _Running | None = None

    def __enter__(self) -> _Running:
        self._previous = getattr(_local, "task", None)
        _local.task = self._running
        return self._running

    def __exit__(self, *exc_info: object) -> None:
        _local.task = self._previous


@contextmanager
def running_actor(worker: TaskWorker, key: str, allocation: Allocation) -> Iterator[None]:
    """Within this block, this thread runs a call on the actor of ``key``: it sees
    the actor's worker and what the actor holds, as its constructor did."""
    previous = getattr(_local, "task", None)
    _local.task = _Running(worker, key, allocation, threading.Event(), actor=True)
    try:
        yield
    finally:
        _local.task = previous


def host_actor(instance: object) -> tuple[str, str]:
    """From an actor's constructor task: keep ``instance`` on this worker as the actor
    of the running task's key; returns that key and the worker's data address."""
    current = _current("host_actor")
    current.worker.actors.host(current.key, instance, current.allocation)
    return current.key, current.worker.address


#: The actor whose ``async def`` method is running, on its worker's loop: a context
#: variable, not ``_local``, since the loop interleaves it with other coroutines.
_awaited_actor: ContextVar[_Running | None] = ContextVar("apportion_awaited_actor", default=None)


@contextmanager
def awaiting_actor(worker: TaskWorker, key: str, allocation: Allocation) -> Iterator[None]:
    """Within this block (a coroutine on the worker's loop), an ``async def`` method
    of the actor of ``key`` runs: the actors it calls on this worker are found."""
    token = _awaited_actor.set(_Running(worker, key, allocation, threading.Event(), actor=True))
    try:
        yield
    finally:
        _awaited_actor.reset(token)


@dataclass(frozen=True, slots=True)
class ActorHere:
    """An actor of the worker the calling actor runs on (``local_actor``)."""

    actor: LocalActor
    #: Called from an actor's thread, which may run the call itself; else from an
    #: ``async def`` method on the worker's loop, which must not wait on the call.
    on_thread: bool


def local_actor(key: str, address: str) -> ActorHere | None:
    """The actor of ``key`` at ``address`` when an actor's call on that same worker
    asks (on its thread, or an ``async def`` method on the loop) and the worker
    still holds it; else None: call it through a client. Only from an actor, as
    Dask: a task calling an actor of its worker queues on the actor's thread,
    which is free to take the call."""
    current: _Running | None = getattr(_local, "task", None)
    on_thread = current is not None and current.actor
    if not on_thread:
        current = _awaited_actor.get()
    if current is None or current.worker.address != address:
        return None
    found = current.worker.actors.local(key)
    return None if found is None else ActorHere(found, on_thread)


def in_task() -> bool:
    """This thread is running a task on a worker."""
    return getattr(_local, "task", None) is not None


def _current(caller: str) -> _Running:
    current: _Running | None = getattr(_local, "task", None)
    if current is None:
        raise RuntimeError(f"{caller}() is only available inside a task running on a worker")
    return current


def _label_values(held: Sequence[str], pool: Sequence[str]) -> list[int] | list[str]:
    """Labels as ints when the worker's whole pool is numbered, else as text.

    Decided on the pool, not on the labels held, so that one pool always gives
    the same type: with ``gpu=[0,1,MIG-a]`` a task holding ``0`` gets ``["0"]``,
    not ``[0]`` one run and ``["MIG-a"]`` the next.
    """
    if all(_DECIMAL.fullmatch(label) for label in (*pool, *held)):
        return [int(label) for label in held]
    return list(held)


def task_resources() -> dict[str, float | list[int] | list[str]]:
    """The resources the running task holds: ``{"GPU": 1.0, "gpu": [2, 3]}``.

    Amount pools give the amount in units; indexed pools give the unit labels held
    (also for a fractional request, which shares one unit), as ints when the pool
    is numbered. Raises ``RuntimeError`` outside a task, rather than answer ``{}``
    and let code believe it holds nothing when it is simply not running on a worker.
    """
    allocation = _current("task_resources").allocation
    pools = _current("task_resources").worker.units
    held: dict[str, float | list[int] | list[str]] = {}
    for name, ticks in allocation.resources.items():
        labels = allocation.units.get(name)
        if labels is None:
            held[name] = ticks / SCALE
        else:
            held[name] = _label_values(labels, pools.get(name, ()))
    for name, labels in allocation.units.items():
        if name not in held:  # labels without an amount: still held, so still shown
            held[name] = _label_values(labels, pools.get(name, ()))
    return held


def task_variant() -> int:
    """Which of its alternative demands the running task got (0 for the first).

    ``submit(f, resources=[{"gpu": 1, "cpus": 1}, {"cpus": 8}])``: inside ``f``, 1 means
    it runs on 8 CPUs instead of a GPU. A task that gave one demand always sees 0.
    """
    return _current("task_variant").allocation.alternative


def task_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a process the running task starts, so it uses what the task holds.

    A copy of ``base`` (default ``os.environ``) with ``APPORTION_RESOURCE_<NAME>`` for
    every pool held (labels comma-joined, or the amount) and ``CUDA_VISIBLE_DEVICES``
    set to the labels of a ``gpu`` pool (any case). A task holding no GPU units
    leaves ``CUDA_VISIBLE_DEVICES`` as ``base`` has it: a mask the worker runs under
    (as Slurm sets) is kept, never widened. Raises ``RuntimeError`` outside a task.
    """
    current = _current("task_environment")
    env = dict(os.environ if base is None else base)
    for variable, value in _resource_variables(current.allocation).items():
        env[variable] = value
    return env


def _resource_variables(allocation: Allocation) -> dict[str, str]:
    """``APPORTION_RESOURCE_*`` and, for GPU units held, ``CUDA_VISIBLE_DEVICES``."""
    names: dict[str, str] = {}
    variables: dict[str, str] = {}
    for name in sorted({*allocation.resources, *allocation.units}):
        variable = RESOURCE_VARIABLE_PREFIX + _NOT_ALNUM.sub("_", name.upper())
        if variable in names:
            # Picking one would hand a process the wrong pool without a word.
            raise RuntimeError(
                f"resources {names[variable]!r} and {name!r} both map to {variable}; "
                "rename one of the pools"
            )
        names[variable] = name
        labels = allocation.units.get(name)
        if labels is None:
            variables[variable] = format_amount(allocation.resources[name])
        else:
            variables[variable] = ",".join(labels)
            if name.lower() == "gpu":
                variables[CUDA_VARIABLE] = variables[variable]
    return variables


def task_held() -> str:
    """What the running task holds in the spec syntax: ``"foo=5 gpu=[0]"`` ("" if nothing)."""
    allocation = _current("task_held").allocation
    return format_resources(allocation.resources, allocation.units)


def task_key() -> str:
    """The key of the running task (a run's key is ``run-<id>``)."""
    return _current("task_key").key


def task_cancel_event() -> threading.Event:
    """Set once the scheduler no longer wants this task's result (cancelled, released).

    Python code cannot be stopped from outside without risk, so a long task that
    wants to stop early watches this (``if task_cancel_event().is_set(): return``);
    command runs use it to stop their process group.
    """
    return _cancel_of(_current("task_cancel_event"))


def _cancel_of(running: _Running) -> threading.Event:
    """``running``'s cancel event, made now if nothing asked for it before."""
    cancel = running.cancel
    if not isinstance(cancel, threading.Event):
        cancel = running.cancel = cancel()
    return cancel


class CancelEvent(threading.Event):
    """A task's cancel event (``task_cancel_event``), saying why it was set."""

    def __init__(self) -> None:
        super().__init__()
        #: Set by an ``InterruptTasks``: the scheduler stops the task's work to run it
        #: again later (preemption), rather than no longer wanting it.
        self.interrupted = False


class TaskInterrupted(Exception):
    """Raised by a task whose work was stopped by an interruption (``task_interrupted``),
    not failed on its own: the worker reports it so (``TaskRaised.interrupted``) and
    the scheduler runs the task again, its retries untouched."""


def task_interrupted() -> bool:
    """Whether the running task's cancel event was set by an interruption (preemption:
    it will run again) rather than a cancel; False while it is not set."""
    cancel = _cancel_of(_current("task_interrupted"))
    return isinstance(cancel, CancelEvent) and cancel.is_set() and cancel.interrupted


def current_worker(caller: str = "get_worker") -> TaskWorker:
    """The worker running the current task; ``RuntimeError`` naming ``caller``
    outside a task. Users call ``get_worker`` (``worker/service.py``)."""
    return _current(caller).worker


def secede(keep_resources: bool = False) -> None:
    """Give this task's thread back while it waits on other tasks (Dask's ``secede``).

    Another task starts on the thread meanwhile, and the task's resources go back to
    the scheduler for its subtasks, so a GPU task waiting on GPU subtasks cannot
    deadlock a one-GPU worker. ``keep_resources=True`` keeps them held (a task whose
    process owns state on its device). Seceding twice is the same as once.
    ``RuntimeError`` outside a task.
    """
    current = _current("secede")
    if current.seceded or current.runner is None:
        return
    current.seceded = True
    current.runner.secede(current.key, keep_resources)


def rejoin() -> None:
    """Count on a thread of the worker again after ``secede`` (Dask's ``rejoin``).

    A task that gave its resources back waits here until it holds the same ones
    again (first asked, first served, ahead of new tasks). It does not wait for a
    thread: the worker may run more tasks than threads for a while. A no-op when the
    task has not seceded. ``RuntimeError`` outside a task.
    """
    current = _current("rejoin")
    if not current.seceded or current.runner is None:
        return
    current.runner.rejoin(current.key)
    current.seceded = False


def seceded() -> bool:
    """The running task has seceded and not rejoined (False outside a task)."""
    current: _Running | None = getattr(_local, "task", None)
    return current is not None and current.seceded
