"""The allocator of a cluster that grows through a batch system: pure, time passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.core.resources import SCALE
from apportion.deploy.allocator import (
    ENDED,
    QUEUED,
    RUNNING,
    STUCK,
    Allocator,
    Cancel,
    JobShape,
    JobState,
    Policy,
    Report,
    Submit,
    Waiting,
    WorkerSeen,
    job_of_worker,
)

GIB = 2**30 * SCALE
CPU = JobShape("cpu", 1, 4, {"cpus": 4 * SCALE, "memory": 16 * GIB})
GPU = JobShape(
    "gpu", 1, 4, {"cpus": 4 * SCALE, "memory": 16 * GIB, "gpu": 2 * SCALE}, frozenset({"gpu"})
)
PLAIN = Waiting(({},), 1)
#: Slurm's words, as ``SlurmBatch`` reports them.
RUN = JobState(RUNNING, "RUNNING")
WAIT = JobState(QUEUED, "PENDING")


def gpu_work(count: int, gpus: float = 1) -> Waiting:
    return Waiting(({"gpu": int(gpus * SCALE)},), count)


def submits(commands: list[object]) -> list[str]:
    return [c.shape for c in commands if isinstance(c, Submit)]


def cancels(commands: list[object]) -> list[str]:
    return [c.job for c in commands if isinstance(c, Cancel)]


def reports(commands: list[object]) -> list[str]:
    return [c.text for c in commands if isinstance(c, Report)]


def adaptive(*shapes: JobShape, **policy: float) -> Allocator:
    allocator = Allocator(shapes or (CPU, GPU))
    allocator.adapt(Policy(**policy))  # type: ignore[arg-type]
    return allocator


# --- what work asks for -------------------------------------------------------------------


def test_gpu_work_asks_for_a_gpu_job_and_cpu_work_for_a_cpu_job() -> None:
    allocator = adaptive(backlog=4)
    assert submits(allocator.step(0, [gpu_work(1)], [], {})) == ["gpu"]
    allocator.submitted(0, "gpu", "101")
    assert submits(allocator.step(1, [gpu_work(1), PLAIN], [], {"101": WAIT})) == ["cpu"]


def test_nothing_is_submitted_without_waiting_work() -> None:
    allocator = adaptive()
    assert allocator.step(0, [], [], {}) == []


def test_a_job_is_sized_by_how_many_tasks_it_runs_at_once() -> None:
    allocator = adaptive(backlog=10)
    # Two GPUs per job: 5 one-GPU tasks need 3 jobs, 4 half-GPU tasks one job (4 threads).
    assert submits(allocator.step(0, [gpu_work(5)], [], {})) == ["gpu"] * 3
    allocator = adaptive(backlog=10)
    assert submits(allocator.step(0, [gpu_work(4, 0.5)], [], {})) == ["gpu"]


def test_work_no_shape_fits_is_reported_once_and_asks_for_nothing() -> None:
    allocator = adaptive()
    first = allocator.step(0, [gpu_work(3, gpus=4)], [], {})
    assert submits(first) == []
    (text,) = reports(first)
    assert "3 task(s) ask for gpu=4" in text and "no job shape offers it" in text
    assert "gpu: 1 worker of 4 threads" in text
    assert reports(allocator.step(1, [gpu_work(3, gpus=4)], [], {})) == []
    assert allocator.status(1)["unsatisfiable"] == [text]
    allocator.step(2, [], [], {})  # gone, so reported again if it comes back
    assert reports(allocator.step(3, [gpu_work(1, gpus=4)], [], {}))


def test_alternatives_take_the_shape_that_fits_best() -> None:
    allocator = adaptive()
    either = Waiting(({"gpu": SCALE}, {"cpus": 2 * SCALE}), 1)
    assert submits(allocator.step(0, [either], [], {})) == ["cpu"]


def test_work_bound_to_named_workers_asks_for_nothing() -> None:
    allocator = adaptive()
    assert allocator.step(0, [Waiting(({},), 5, restricted=True)], [], {}) == []


# --- bounds ---------------------------------------------------------------------------


def test_the_backlog_bounds_jobs_waiting_in_the_queue() -> None:
    allocator = adaptive(backlog=2)
    assert submits(allocator.step(0, [gpu_work(100)], [], {})) == ["gpu", "gpu"]
    assert submits(allocator.step(1, [gpu_work(100)], [], {})) == []  # still in flight
    allocator.submitted(1, "gpu", "1")
    allocator.submitted(1, "gpu", "2")
    assert submits(allocator.step(2, [gpu_work(100)], [], {"1": WAIT, "2": WAIT})) == []
    # One starts: its workers connect and room in the backlog opens.
    seen = [WorkerSeen("slurm-1", "1", 2)]
    states = {"1": RUN, "2": WAIT}
    assert submits(allocator.step(3, [gpu_work(100)], seen, states)) == ["gpu"]


def test_the_maximum_bounds_workers() -> None:
    shape = JobShape("pair", 2, 1, {"cpus": SCALE})
    allocator = adaptive(shape, backlog=10, maximum=5)
    assert submits(allocator.step(0, [Waiting(({},), 100)], [], {})) == ["pair"] * 2


def test_the_minimum_is_kept_without_work() -> None:
    allocator = adaptive(minimum=2)
    assert submits(allocator.step(0, [], [], {})) == ["cpu", "cpu"]


# --- shrinking ------------------------------------------------------------------------


def running(allocator: Allocator, job: str, shape: str = "gpu") -> dict[str, JobState]:
    allocator.submitted(0, shape, job)
    return {job: RUN}


def test_a_job_idle_past_the_timeout_is_cancelled() -> None:
    allocator = adaptive(idle_timeout=60)
    states = running(allocator, "7")
    busy = [WorkerSeen("slurm-7", "7", 1)]
    idle = [WorkerSeen("slurm-7", "7", 0)]
    assert allocator.step(10, [], busy, states) == []
    assert allocator.step(20, [], idle, states) == []  # idle from 20
    assert allocator.step(79, [], idle, states) == []
    out = allocator.step(80, [], idle, states)
    assert cancels(out) == ["7"]
    assert allocator.step(81, [], idle, states) == []  # cancelled once
    assert allocator.step(90, [], [], {}) == []  # ended as asked: no failure


def test_busy_again_resets_the_idle_clock() -> None:
    allocator = adaptive(idle_timeout=60)
    states = running(allocator, "7")
    allocator.step(0, [], [WorkerSeen("slurm-7", "7", 0)], states)
    allocator.step(50, [], [WorkerSeen("slurm-7", "7", 3)], states)
    assert allocator.step(100, [], [WorkerSeen("slurm-7", "7", 0)], states) == []
    assert cancels(allocator.step(160, [], [WorkerSeen("slurm-7", "7", 0)], states)) == ["7"]


def test_the_minimum_keeps_an_idle_job() -> None:
    allocator = adaptive(idle_timeout=1, minimum=1)
    allocator.submitted(0, "cpu", "3")
    idle = [WorkerSeen("slurm-3", "3", 0)]
    allocator.step(0, [], idle, {"3": RUN})
    assert allocator.step(100, [], idle, {"3": RUN}) == []


def test_a_waiting_job_no_work_needs_is_cancelled_at_once() -> None:
    allocator = adaptive(backlog=3)
    allocator.step(0, [gpu_work(3)], [], {})
    for job in ("1", "2"):
        allocator.submitted(0, "gpu", job)
    allocator.submit_failed(0, "gpu", "nodes busy")
    out = allocator.step(1, [gpu_work(1)], [], {"1": WAIT, "2": WAIT})
    assert cancels(out) == ["2"]  # the newest


# --- failures ---------------------------------------------------------------------------


def test_repeated_failures_pause_submission_and_say_so() -> None:
    allocator = adaptive(max_failures=2, pause=100, backlog=1)
    work = [gpu_work(1)]
    allocator.step(0, work, [], {})
    assert reports(allocator.submit_failed(0, "gpu", "sbatch: error: invalid partition"))
    assert submits(allocator.step(1, work, [], {})) == ["gpu"]
    out = allocator.submit_failed(1, "gpu", "sbatch: error: invalid partition")
    assert any("paused for 100 s after 2 failures" in t for t in reports(out))
    assert submits(allocator.step(2, work, [], {})) == []
    assert allocator.status(2)["paused_for"] == 99
    assert submits(allocator.step(101, work, [], {})) == ["gpu"]


def test_a_job_that_ends_before_its_workers_connect_is_a_failure() -> None:
    allocator = adaptive()
    allocator.submitted(0, "gpu", "5")
    out = allocator.step(1, [gpu_work(1)], [], {})
    assert any(
        "gpu job 5 ended (gone) before any of its workers connected" in t for t in reports(out)
    )
    assert allocator.failures == 1


def test_a_job_still_listed_as_ended_is_a_failure_named_in_the_systems_word() -> None:
    allocator = adaptive()
    allocator.submitted(0, "gpu", "5")
    out = allocator.step(1, [], [], {"5": JobState(ENDED, "FAILED")})
    assert any("gpu job 5 ended (FAILED)" in t for t in reports(out))
    assert allocator.jobs == {}


def test_a_stuck_job_is_a_failure_and_is_cancelled_once() -> None:
    allocator = adaptive(backlog=1)
    allocator.submitted(0, "gpu", "8")
    stuck = {"8": JobState(STUCK, "Eqw")}
    out = allocator.step(1, [gpu_work(1)], [], stuck)
    assert cancels(out) == ["8"]
    assert any("held in state Eqw" in t for t in reports(out))
    assert allocator.failures == 1
    # Cancelled, it no longer holds the backlog's place: the work asks for another job.
    assert submits(out) == ["gpu"]
    again = allocator.step(2, [gpu_work(1)], [], stuck)
    assert cancels(again) == [] and reports(again) == []
    allocator.step(3, [], [], {})  # gone: forgotten, and no second failure
    assert "8" not in allocator.jobs and allocator.failures == 1


def test_a_phase_outside_the_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match="job phase 'PENDING'"):
        JobState("PENDING", "PENDING")


def test_a_job_whose_workers_connected_resets_the_failures() -> None:
    allocator = adaptive()
    allocator.in_flight["cpu"] = 1
    allocator.submit_failed(0, "cpu", "x")
    assert allocator.failures == 1
    allocator.submitted(0, "cpu", "9")
    allocator.step(1, [], [WorkerSeen("slurm-9", "9", 1)], {"9": RUN})
    assert allocator.failures == 0
    # Ended at its walltime, having run work: not a failure.
    assert reports(allocator.step(2, [], [], {})) == []


# --- a fixed size -----------------------------------------------------------------------


def test_scale_sets_a_fixed_number_of_workers() -> None:
    allocator = Allocator([CPU, GPU])
    allocator.scale(3)
    assert submits(allocator.step(0, [gpu_work(50)], [], {})) == ["cpu"] * 3
    for job in ("1", "2", "3"):
        allocator.submitted(0, "cpu", job)
    states = {"1": RUN, "2": RUN, "3": WAIT}
    seen = [WorkerSeen("slurm-1", "1", 1), WorkerSeen("slurm-2", "2", 0)]
    allocator.step(1, [], seen, states)
    allocator.scale(1)
    assert cancels(allocator.step(2, [], seen, states)) == ["3", "2"]  # waiting, then idle


def test_worker_names_carry_their_job() -> None:
    assert job_of_worker("slurm-1234", "slurm") == "1234"
    assert job_of_worker("slurm-1234-3", "slurm") == "1234"
    assert job_of_worker("slurm-x", "slurm") is None
    assert job_of_worker("laptop", "slurm") is None


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="minimum <= maximum"):
        Policy(minimum=3, maximum=2)
    with pytest.raises(ValueError, match="backlog"):
        Policy(backlog=0)
    with pytest.raises(ValueError, match="distinct names"):
        Allocator([CPU, CPU])


# --- invariants -------------------------------------------------------------------------

_WORK = st.lists(
    st.builds(
        Waiting,
        st.sampled_from([({},), ({"gpu": SCALE},), ({"gpu": 3 * SCALE},), ({"cpus": 2 * SCALE},)]),
        st.integers(0, 50),
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(
    rounds=st.lists(
        st.tuples(_WORK, st.booleans(), st.sampled_from(["ok", "fail", "start", "end", "stuck"])),
        max_size=25,
    ),
    backlog=st.integers(1, 3),
    maximum=st.integers(0, 8),
)
def test_submissions_stay_within_the_bounds_and_fit_the_work(
    rounds: list[tuple[list[Waiting], bool, str]], backlog: int, maximum: int
) -> None:
    allocator = adaptive(backlog=backlog, maximum=maximum, max_failures=2, pause=5)
    states: dict[str, JobState] = {}
    ids = iter(range(1, 10_000))
    for now, (work, busy, outcome) in enumerate(rounds):
        seen = [WorkerSeen(f"slurm-{j}", j, int(busy)) for j, s in states.items() if s == RUN]
        out = allocator.step(float(now), work, seen, states)
        for job, state in states.items():
            if state.phase == STUCK and job in allocator.jobs:
                assert allocator.jobs[job].state == "cancelled", "a stuck job was kept"
        asked = submits(out)
        fitting = {
            shape.name
            for kind in work
            if kind.count
            for shape in allocator.shapes.values()
            for option in kind.options
            if shape.fits(option)
        }
        assert set(asked) <= fitting, "a job was asked for that no waiting work fits"
        if allocator.paused(float(now)):
            assert not asked
        for job in cancels(out):
            states.pop(job, None)
        for shape in asked:
            if outcome == "fail":
                allocator.submit_failed(float(now), shape, "refused")
            else:
                job = str(next(ids))
                allocator.submitted(float(now), shape, job)
                states[job] = RUN if outcome == "start" else WAIT
        if outcome == "end" and states:
            states.pop(next(iter(states)))
        if outcome == "stuck" and states:  # Grid Engine's Eqw: listed, never to run
            states[next(iter(states))] = JobState(STUCK, "Eqw")
        live = [j for j in allocator.jobs.values() if j.state != "cancelled"]
        assert sum(j.shape.processes for j in live) <= maximum
        for shape in allocator.shapes.values():
            waiting = [j for j in live if j.shape is shape and j.state == "queued"]
            assert len(waiting) + allocator.in_flight[shape.name] <= backlog
