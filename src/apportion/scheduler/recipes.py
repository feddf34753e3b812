"""A task's recipe, for a client that runs the task itself (Dask's
``recreate_error_locally`` and ``recreate_task_locally``).

The recipe is what the client sent: the pickled function and arguments, kept on
the task record so that a lost result can be computed again. The scheduler hands
those bytes back unopened, with the keys whose values the arguments take; the
client fetches those values and runs the call in its own thread, under its
debugger. Nothing here unpickles anything.

Which task, for a failure: a task failed by a failed input carries that input's
error, so the walk goes from each failed key to an input that failed with the
same error, until none did. That task is the one whose own run raised (or was
lost, or was cancelled). A failed input with such a dependent is kept while the
dependent's record lives (``SchedulerState.forget``), so the walk finds it.
"""

from __future__ import annotations

from apportion.protocol.tasks import RecipeRequest, TaskRecipe
from apportion.scheduler.records import ERRED, ClientRecord, TaskRecord
from apportion.scheduler.state import SCATTERED, SchedulerState


def recipe(state: SchedulerState, client: ClientRecord, msg: RecipeRequest) -> None:
    """Reply with the recipe of ``keys[0]``, or (``blame``) of the task behind the
    failure of the first failed key; ``problem`` in words where there is none."""
    task, problem = _chosen(state, msg)
    if task is None:
        state.reply(client.id, TaskRecipe(msg.request_id, "", b"", b"", [], problem))
        return
    function = state.functions.get(task.func_id)
    if task.func_id == SCATTERED:
        problem = f"{task.key!r} is scattered data, not a task: there is nothing to run"
    elif function is None:
        problem = f"the scheduler no longer keeps the function of {task.key!r}"
    if problem:
        state.reply(client.id, TaskRecipe(msg.request_id, task.key, b"", b"", [], problem))
        return
    reply = TaskRecipe(msg.request_id, task.key, function or b"", task.args, list(task.deps), "")
    state.reply(client.id, reply)


def _chosen(state: SchedulerState, msg: RecipeRequest) -> tuple[TaskRecord | None, str]:
    if not msg.blame:
        key = msg.keys[0] if msg.keys else ""
        task = state.tasks.get(key)
        if task is None:
            return None, f"the scheduler does not know {key!r}: it was released, or never submitted"
        return task, ""
    for key in msg.keys:
        task = state.tasks.get(key)
        if task is not None and task.error is not None:  # failed (or failing, if running)
            return blamed(state, task), ""
    return None, (
        f"the scheduler no longer knows the failed tasks {msg.keys!r}: they were released"
    )


def blamed(state: SchedulerState, failed: TaskRecord) -> TaskRecord:
    """The task whose own run failed ``failed``: ``failed`` itself, or the input (or
    input's input) it took its error from."""
    current = failed
    while True:
        cause = None
        for dep_key in current.deps:
            dep = state.tasks.get(dep_key)
            if dep is not None and dep.state == ERRED and dep.error == current.error:
                cause = dep
                break
        if cause is None:
            return current
        current = cause
