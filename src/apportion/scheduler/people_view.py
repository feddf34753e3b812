"""The cluster's status as a person sees it: their own work, everyone's totals.

``status.py`` builds the status the owner sees; a person's (``apportion status``
given their credential) is narrowed here. What names or counts other people's work
goes or becomes theirs alone: task counts, groups, running tasks and the keys
holding resources, the task stream, and the waiting work's oldest task and its
reason. Workers, their pools (how much is in use, by anyone) and the number of
clients stay: a person may know how busy the cluster is, not with what. Warnings
are left out: their text may name anyone's tasks. Of the shares, a person sees
their own row only: who else is admitted, and what each holds, is the owner's to
know (``apportion user list`` is the owner's alone); their own fair share is still
reckoned against everyone's weights, so it says how contended the cluster is.

It walks the person's tasks, once per status asked: a person's ``--watch``
costs a pass over the tasks each second, the owner's nothing more than before.
"""

from __future__ import annotations

from typing import Any

from apportion.scheduler.records import LIVE_STATES
from apportion.scheduler.state import SchedulerState


def narrow_status(state: SchedulerState, person: str, built: dict[str, Any]) -> dict[str, Any]:
    """``built`` (``status.status``) with only what ``person`` may see."""
    tasks = state.tasks
    counts = dict.fromkeys(LIVE_STATES, 0)
    groups: set[str] = set()
    for task in tasks.values():
        if task.person == person:
            if task.state in counts:
                counts[task.state] += 1
            if task.group is not None:
                groups.add(task.group.name)

    def theirs(key: object) -> bool:
        task = tasks.get(key) if isinstance(key, str) else None
        return task is not None and task.person == person

    for worker in built["workers"]:
        worker["tasks"] = [t for t in worker["tasks"] if theirs(t["key"])]
        for pool in worker["pools"]:
            pool["holders"] = [k for k in pool["holders"] if theirs(k)]
            for unit in pool["units"] or ():
                unit["holders"] = [k for k in unit["holders"] if theirs(k)]
    for kind in built["pending"]:
        if not theirs(kind["oldest"]):
            kind["oldest"], kind["why"] = "(another person's)", ""
    stream = built["stream"]
    stream["items"] = [item for item in stream["items"] if theirs(item[3])]
    return {
        **built,
        "tasks": counts,
        "groups": [g for g in built["groups"] if g["name"] in groups],
        "shares": [row for row in built["shares"] if row["share"] == person],
        "events": {"seq": built["events"]["seq"], "items": []},
    }
