"""Run records built in memory, for tests of what is shown about runs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apportion.runs.journal import QUEUED, RunRecord
from apportion.runs.spec import new_spec

#: A fixed "now", so that ages and times in the output are known.
NOW = 1_700_000_000.0


def record(run_id: int = 1, **overrides: Any) -> RunRecord:
    spec = new_spec(
        overrides.pop("command", ["python", "train.py"]),
        cwd="/work",
        env={"A": "1", "B": "2"},
        resources=overrides.pop("resources", "foo=1"),
        name=overrides.get("name", ""),
        time_limit=overrides.pop("time_limit", None),
        retries=overrides.pop("retries", 0),
        preemptible=overrides.pop("preemptible", False),
    )
    fields: dict[str, Any] = {
        "id": run_id,
        "name": "",
        "state": QUEUED,
        "spec": spec,
        "priority": 0,
        "created": NOW - 30,
        "started": None,
        "ended": None,
        "worker": "",
        "held": "",
        "attempts": 0,
        "exit_code": None,
        "signal": None,
        "reason": "",
        "cancel_requested": False,
        "array_id": None,
        "array_index": None,
        "waiting": "",
    }
    fields.update(overrides)
    if fields["array_index"] is not None:
        fields["spec"] = replace(spec, array_index=fields["array_index"])
    return RunRecord(**fields)
