"""Actors: an object built by a task that stays on its worker and takes calls.

``client.submit(Counter, actor=True)`` runs ``Counter()`` on a worker whose
resources fit, as any task; the object stays there, and the future's result is an
``Actor``: a handle whose method calls travel as one message each, straight to that
worker's data port, and come back as ``ActorFuture`` objects. The scheduler keeps the
task's resources held while the actor lives (an actor that took a GPU keeps it), and
lets them go once every future of it and every handle on the client are released.

Handles travel: an ``Actor`` passed to a task, or gathered by another client, calls
the same object. Inside a task, its calls go through the worker's client
(``get_client()``). An actor is not recomputed: if its worker is lost, its future
fails, saying so, and calls raise ``ConnectionError``.

An actor's method calling another actor of its own worker (or itself) sends no
message: the call runs at once on the calling thread and its ``ActorFuture`` is
already done, as Dask's. Through a round trip, a worker of one thread would wait
on itself, and ``result(timeout=0.001)`` would expire; ``worker/actors.py`` says how
"one call at a time" still holds. From an ``async def`` method, which runs on the
worker's loop, a plain method goes to the called actor's thread instead (still no
message), so that the loop never waits on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import importlib
import inspect
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from apportion.client import dask_default
from apportion.client.future import Future, FutureOwner, rebuild_exception
from apportion.core import payload
from apportion.core.durations import Duration, seconds
from apportion.protocol.peer_data import ActorCall, ActorReply
from apportion.protocol.tasks import SubmitTasks
from apportion.worker.context import ActorHere, host_actor, in_task, local_actor

#: The client of the worker running the current task (``task_client.py`` sets it:
#: it imports ``Client``, which imports this module).
_task_client: Callable[[], FutureOwner] | None = None


def calls_from_tasks_through(factory: Callable[[], FutureOwner]) -> None:
    """Handles used inside a task call through ``factory()``, the worker's client."""
    global _task_client  # set once, at import of task_client
    _task_client = factory


class ActorConstructor:
    """The function of an actor's task: builds the object and leaves it on the worker;
    the task's result is the handle on it."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        #: Names the task's key after the class, as a function would.
        self.__name__ = getattr(cls, "__name__", type(cls).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Actor:
        instance = self.cls(*args, **kwargs)
        key, address = host_actor(instance)
        return Actor(self.cls, address, key)


class Actor:
    """A handle on an actor (Dask's ``Actor``): ``actor.method(...)`` returns an
    ``ActorFuture``; ``actor.attribute`` returns the attribute's value (an awaitable of
    it for an asynchronous client). As in Dask, the names are the class's: an
    attribute the actor sets in ``__init__`` is declared on the class too.

    Used by a method of another actor of the same worker, calls run at once on the
    caller's thread (an ``ActorFuture`` already done; an ``async def`` method gives
    its coroutine, to await) and attributes are read directly, as in Dask; from an
    ``async def`` method, plain methods run on the called actor's thread."""

    def __init__(self, cls: type, address: str, key: str) -> None:
        self._cls = cls
        self._address = address
        self.key = key
        self._client: FutureOwner | None = None
        #: On a client (not in a task): keeps the actor alive while this handle is.
        self._future: Future | None = None

    def __reduce__(self) -> tuple[Callable[..., Actor], tuple[type, str, str]]:
        return _rebuilt, (self._cls, self._address, self.key)

    def __repr__(self) -> str:
        return f"<Actor: {self._cls.__name__}, key={self.key}>"

    def __dir__(self) -> list[str]:
        return sorted(
            {*object.__dir__(self), *(n for n in dir(self._cls) if not n.startswith("_"))}
        )

    def __getattr__(self, name: str) -> Any:
        # As Dask: only names the class has are the actor's (an attribute set in
        # ``__init__`` only is declared on the class too, ``n = 0``), so that probing
        # a handle (``hasattr(actor, "nbytes")``) never sends a call.
        if name.startswith("_") or not hasattr(self._cls, name):
            raise AttributeError(f"{self._cls.__name__} has no attribute {name!r}")
        on_class = getattr(self._cls, name)
        here = local_actor(self.key, self._address)
        if here is not None:
            return self._here(here, name, callable(on_class))
        if callable(on_class):

            def call(*args: Any, **kwargs: Any) -> ActorFuture:
                return self._send(name, args, kwargs, attribute=False)

            call.__name__ = name
            call.__doc__ = getattr(on_class, "__doc__", None)
            return call
        future = self._send(name, (), {}, attribute=True)
        return future if getattr(self._client, "asynchronous", False) else future.result()

    def _here(self, here: ActorHere, name: str, method: bool) -> Any:
        """``name`` of an actor of the worker the calling actor runs on, without a
        message: a round trip would have the caller wait on a call that its own
        worker, or its own thread, must run (a worker of one thread deadlocks).
        Arguments and results are the objects themselves, not copies, as Dask's."""
        local = here.actor
        if not method:
            if here.on_thread:  # one call of it: a property runs code
                return local.run(getattr, local.instance, name)
            return getattr(local.instance, name)  # on the loop, as its async methods read
        bound = getattr(local.instance, name)
        if inspect.iscoroutinefunction(bound):
            return bound  # as Dask: its coroutine, run by whoever awaits it
        what = f"{self._cls.__name__}.{name}"

        def call(*args: Any, **kwargs: Any) -> ActorFuture:
            if not here.on_thread:  # the loop must not wait: its own thread runs it
                try:
                    pending = local.submit(bound, *args, **kwargs)
                except LookupError as exc:
                    return ActorFuture.finished(what, self._address, exception=exc)
                return ActorFuture(_ran_later(pending), what, self._address, asynchronous=True)
            try:
                value = local.run(bound, *args, **kwargs)
            except Exception as exc:  # raised by result(), as a remote call's
                return ActorFuture.finished(what, self._address, exception=exc)
            return ActorFuture.finished(what, self._address, value)

        call.__name__ = name
        call.__doc__ = getattr(bound, "__doc__", None)
        return call

    def _bound(self) -> FutureOwner:
        """The client calls go through: the worker's inside a task, else the default
        client (the newest one made with ``set_as_default``), found once."""
        client = self._client
        if client is not None and not client._closed:
            return client
        if in_task():
            if _task_client is None:
                # A worker process loads no client code until a task needs it
                # (``import apportion`` is lazy). Loading the module registers the
                # factory; by name, as ``apportion``'s lazy names are, because it
                # imports ``Client``, which imports this module.
                importlib.import_module("apportion.client.task_client")
            assert _task_client is not None
            client = _task_client()
            self._client = client
            return client
        client = dask_default.current()
        if client is None:
            raise RuntimeError(f"{self!r}: no client to call it through; make a Client first")
        self.bind(client)
        return client

    def bind(self, client: FutureOwner) -> None:
        """Call through ``client``, which keeps the actor alive while this handle is."""
        self._client = client
        self._future = Future(self.key, client)
        if self._future._key_state.refs == 1:
            # New to this client: have the scheduler keep the actor for it.
            client._link.connected.post(SubmitTasks([], {}, [self.key]))

    def _send(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, attribute: bool
    ) -> ActorFuture:
        client = self._bound()
        blob, keys = payload.pack_call(args, kwargs)
        if keys:
            raise TypeError(
                f"{self._cls.__name__}.{name}(): futures cannot be passed to an actor's "
                "methods; pass their results (future.result())"
            )
        session = client._link.connected
        address = self._address

        async def ask() -> ActorReply | _Ran:
            conn = await session.peer(address)
            call = ActorCall(session.next_id(), self.key, name, blob, attribute)
            reply: ActorReply = await session.request(call, conn)
            return reply

        try:
            future = asyncio.run_coroutine_threadsafe(ask(), session.loop.loop)
        except RuntimeError:
            raise RuntimeError(f"{self!r}: its client is closed") from None
        what = f"{self._cls.__name__}.{name}"
        return ActorFuture(future, what, address, client._link.wants_async)


#: The client unpickling results (``binding``): handles found in them bind to it.
_binding: contextvars.ContextVar[FutureOwner | None] = contextvars.ContextVar(
    "apportion_actor_binding", default=None
)


@contextlib.contextmanager
def binding(client: FutureOwner) -> Iterator[None]:
    """Within this block, actor handles unpickled bind to ``client`` at once, so that
    the actor outlives the future its handle came from (``submit(...).result()``)."""
    token = _binding.set(client)
    try:
        yield
    finally:
        _binding.reset(token)


def _rebuilt(cls: type, address: str, key: str) -> Actor:
    actor = Actor(cls, address, key)
    client = _binding.get()
    if client is not None and not client._closed:
        actor.bind(client)
    return actor


@dataclass(frozen=True, slots=True)
class _Ran:
    """The outcome of a call run on the caller's thread: nothing to unpickle."""

    value: Any
    exception: Exception | None


def _ran_later(
    pending: concurrent.futures.Future[Any],
) -> concurrent.futures.Future[ActorReply | _Ran]:
    """What ``ActorFuture`` reads of a call run on its actor's thread of this worker."""
    outcome: concurrent.futures.Future[ActorReply | _Ran] = concurrent.futures.Future()

    def settle(done: concurrent.futures.Future[Any]) -> None:
        exception = done.exception()
        if exception is None:
            outcome.set_result(_Ran(done.result(), None))
        elif isinstance(exception, Exception):
            outcome.set_result(_Ran(None, exception))
        else:  # pragma: no cover - a BaseException ends the thread's call otherwise
            outcome.set_exception(exception)

    pending.add_done_callback(settle)
    return outcome


class ActorFuture:
    """The outcome of one call on an actor (Dask's ``ActorFuture``): ``result()``,
    ``done()``, or ``await`` it."""

    def __init__(
        self,
        future: concurrent.futures.Future[ActorReply | _Ran],
        what: str,
        address: str,
        asynchronous: bool = False,
    ) -> None:
        self._future = future
        self._what = what
        self._address = address
        #: Its client is asynchronous: waiting on it blocks nobody only from a thread.
        self.asynchronous = asynchronous

    @classmethod
    def finished(
        cls, what: str, address: str, value: Any = None, exception: Exception | None = None
    ) -> ActorFuture:
        """A call that already ran here (an actor calling one of its worker's actors):
        ``result(timeout=...)`` returns ``value`` or raises ``exception`` at once."""
        future: concurrent.futures.Future[ActorReply | _Ran] = concurrent.futures.Future()
        future.set_result(_Ran(value, exception))
        return cls(future, what, address)

    def __repr__(self) -> str:
        state = "finished" if self.done() else "pending"
        return f"<ActorFuture: {self._what}, {state}>"

    def done(self) -> bool:
        """The call has returned (or failed)."""
        return self._future.done()

    def result(self, timeout: Duration | None = None) -> Any:
        """The method's return value; its exception if it raised; ``TimeoutError``
        after ``timeout`` (seconds, or Dask's text: ``"1s"``)."""
        limit = seconds(timeout)
        try:
            reply = self._future.result(limit)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self._what} did not return within {timeout}s") from None
        except OSError as exc:
            raise self._unreachable(exc) from None
        return self._outcome(reply)

    def add_done_callback(self, callback: Callable[[ActorFuture], Any]) -> None:
        """Call ``callback(self)`` once the call returned or failed: at once if it has,
        else on the thread that received the reply (``as_completed`` waits so)."""
        self._future.add_done_callback(lambda _: callback(self))

    def exception(self, timeout: Duration | None = None) -> BaseException | None:
        """The exception the call raised, or None."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except BaseException as exc:
            return exc
        return None

    def __await__(self) -> Generator[Any, None, Any]:
        return self._awaited().__await__()

    async def _awaited(self) -> Any:
        try:
            reply = await asyncio.wrap_future(self._future)
        except OSError as exc:
            raise self._unreachable(exc) from None
        return self._outcome(reply)

    def _unreachable(self, exc: OSError) -> ConnectionError:
        return ConnectionError(
            f"{self._what}: the actor's worker {self._address} cannot be reached ({exc}); "
            "an actor lives only there and is lost with it"
        )

    def _outcome(self, reply: ActorReply | _Ran | None) -> Any:
        if reply is None:  # pragma: no cover - the reply always comes or fails
            raise RuntimeError(f"{self._what}: no reply")
        if isinstance(reply, _Ran):
            if reply.exception is not None:
                raise reply.exception
            return reply.value
        if reply.exception:
            raise rebuild_exception(reply.exception, reply.traceback)
        return payload.loads(reply.value)


def actor_task(func: Callable[..., Any]) -> ActorConstructor:
    """What ``submit(func, actor=True)`` runs: ``func`` must be a class."""
    if not isinstance(func, type):
        raise TypeError(
            f"actor=True needs a class to build the actor from, not {type(func).__name__} "
            f"{getattr(func, '__name__', func)!r}"
        )
    return ActorConstructor(func)
