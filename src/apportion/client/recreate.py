"""Running one of the cluster's tasks here, in the calling thread, under its
debugger: Dask's ``recreate_error_locally`` and ``recreate_task_locally``.

The scheduler hands back the task's recipe as this client's side sent it, its
pickled function and arguments, never opened there (``scheduler/recipes.py``).
Here it is unpickled, the values of the task's inputs are fetched (an input whose
result was released is computed again first, as for any future of it), and the
function is called in the caller's thread: ``pdb.runcall``, ``%debug`` or a
breakpoint in the function step into it, and ``recreate_error_locally`` raises the
task's exception from there. The fetching runs on the client's loop, as every
fetch does; only the call runs here.
"""

from __future__ import annotations

from typing import Any

from apportion.client.data_calls import DataHolder, gather_on_loop, settled_on_loop
from apportion.client.future import Future
from apportion.client.graph import wire_key
from apportion.client.results import Gathered
from apportion.client.state import ERROR
from apportion.client.waiting import futures_of
from apportion.core import payload
from apportion.protocol.tasks import RecipeRequest, SubmitTasks, TaskRecipe


def recreate_error_locally(client: DataHolder, future: Any) -> Any:
    """Run here, in this thread, the task whose own run failed ``future`` (a future,
    a list of them, or a persisted Dask collection): raises its exception, so that a
    debugger stops where it was raised.

    The failed task is ``future``'s own, or the input (or input's input) its failure
    came from; its function and arguments come from the scheduler as they were
    submitted, and its inputs' values from the cluster. Waits for ``future`` to
    finish first; ``ValueError`` if none of it failed. An asynchronous client
    returns an awaitable: awaited, the task runs in the awaiting loop's thread.
    """
    found = futures_of(future)
    return _recreate(client, found, [], blame=True)


def recreate_task_locally(client: DataHolder, future: Any) -> Any:
    """Run here, in this thread, the task of ``future`` (or of a key), whether it
    failed or not, and return what it returns (or raise what it raises): for a
    debugger (``pdb.runcall(client.recreate_task_locally, future)``), or to see why
    a result is not what was expected.

    Its function and arguments come from the scheduler as they were submitted, its
    inputs' values from the cluster (computed again if they were released). Waits for
    ``future`` to finish first. An asynchronous client returns an awaitable.
    """
    found = futures_of(future)
    if found:
        return _recreate(client, found[:1], [], blame=False)
    if isinstance(future, str | tuple):  # a key, Dask's tuple keys included
        return _recreate(client, [], [wire_key(future)], blame=False)
    raise TypeError(f"recreate_task_locally takes a future or a key, not {future!r}")


def _recreate(client: DataHolder, found: list[Future], keys: list[str], blame: bool) -> Any:
    link = client._link
    if link.asynchronous:

        async def here() -> Any:
            return _call(client, *await link.run(_prepare, client, found, keys, blame))

        return here()
    return _call(client, *link.run(_prepare, client, found, keys, blame, asynchronous=False))


async def _prepare(
    client: DataHolder, found: list[Future], keys: list[str], blame: bool
) -> tuple[TaskRecipe, Gathered]:
    """On the client's loop: the task's recipe and its inputs' values, still pickled:
    the calling thread unpickles them (``results.loads_here`` says why)."""
    await settled_on_loop(found)
    if blame:
        keys = [f.key for f in found if f.status == ERROR]
        if not keys:
            raise ValueError(
                "No errored futures passed: none of them failed "
                f"({', '.join(sorted({f.status for f in found})) or 'no futures'})"
            )
    elif found:
        keys = [found[0].key]
    recipe: TaskRecipe = await client._link.request(
        lambda rid: RecipeRequest(rid, keys, int(blame))
    )
    if recipe.problem:
        raise ValueError(f"cannot run the task here: {recipe.problem}")
    # Futures of the inputs, so that the scheduler keeps them, or computes them again
    # if their results were released, until their values are here.
    inputs = [Future(key, client) for key in recipe.deps]
    if inputs:
        client._link.post(SubmitTasks([], {}, list(recipe.deps)))
    return recipe, await gather_on_loop(client, inputs)


def _call(client: DataHolder, recipe: TaskRecipe, fetched: Gathered) -> Any:
    """On the calling thread: the task's function called with its inputs' values."""
    values = dict(zip(recipe.deps, fetched.values(client), strict=True))
    func = payload.loads(recipe.function)
    args, kwargs = payload.unpack_call(recipe.args, values)
    return func(*args, **kwargs)
