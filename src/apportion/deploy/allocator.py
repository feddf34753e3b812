"""Which worker jobs to ask a batch system for, and which to give back: pure.

Theory of operation
-------------------
A cluster that grows through a batch system (``SlurmCluster``, ``SGECluster``,
``apportion alloc slurm|sge``) has one or more job *shapes*: what one job brings, as
worker processes each with threads and a supply of resources. Every few seconds its
service feeds ``Allocator.step`` what the scheduler says is waiting
(``scheduler.backlog``: per kind of request, its demands and how many tasks), which
workers are connected and what the batch system says of each job it submitted, as a
``JobState``: the system's own word (``PENDING``, ``qw``) and the *phase* it means,
which the batch system's adapter decides, so that this one machine serves every
system. ``step`` answers with ``Submit``, ``Cancel`` and ``Report`` commands. Time
is passed in.

The rules, after HyperQueue's allocator rather than load-only adaptive scaling:

* Work asks for a shape only if that shape could run it: a GPU task asks for a job
  whose workers have a GPU, never "any job". Among the shapes that fit, the one
  offering the fewest pools the work does not ask for is chosen, so CPU work does
  not take GPU nodes while a CPU shape exists.
* Work no shape could ever run is reported, once per kind of request, naming what
  it asks for and what the shapes offer: no job is submitted for it.
* At most ``backlog`` jobs of a shape wait in the batch queue (or are being
  submitted) at once, and the jobs of all shapes bring at most ``maximum`` workers.
* A running job whose workers have all been idle for ``idle_timeout`` is cancelled
  (its workers drain: results still needed move to the workers that stay), unless
  that would leave fewer than ``minimum`` workers; a job still waiting in the queue
  that no waiting work needs any more is cancelled at once.
* After ``max_failures`` failures in a row (``sbatch``/``qsub`` refused, a job ended
  before any of its workers connected, or one the batch system holds in an error
  state, which is cancelled) submission pauses for ``pause`` seconds, which is
  reported; a job whose workers connected resets the count.
* ``scale(n)`` replaces all this with a fixed target of ``n`` workers of the first
  shape; ``adapt`` goes back to following the work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from apportion.core.ledger import splittable
from apportion.core.resources import describe_resources

#: What a batch system's state of a job means here. ``STUCK``: listed, but it will
#: never run without a person (Grid Engine's ``Eqw``); ``ENDED``: still listed after
#: it ended (Slurm's ``FAILED`` for ``MinJobAge``), as good as gone.
QUEUED = "queued"
RUNNING = "running"
STUCK = "stuck"
ENDED = "ended"
PHASES = frozenset({QUEUED, RUNNING, STUCK, ENDED})


@dataclass(frozen=True, slots=True)
class JobState:
    """One job as its batch system lists it: ``word`` in the system's own terms (quoted
    in reports), ``phase`` what it means to the allocator (one of ``PHASES``)."""

    phase: str
    word: str

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"job phase {self.phase!r}: expected one of {sorted(PHASES)}")


@dataclass(frozen=True, slots=True)
class JobShape:
    """What one job brings: ``processes`` workers, each with ``nthreads`` threads and
    ``supply`` (ticks); ``indexed``: the pools of ``supply`` given as units (GPUs)."""

    name: str
    processes: int
    nthreads: int
    supply: Mapping[str, int]
    indexed: frozenset[str] = frozenset()

    def fits(self, demand: Mapping[str, int]) -> bool:
        """One worker of this shape could run a task with ``demand`` when idle."""
        for pool, need in demand.items():
            if self.supply.get(pool, 0) < need:
                return False
            if pool in self.indexed and not splittable(need):
                return False
        return True

    def slots(self, demand: Mapping[str, int]) -> int:
        """Tasks with ``demand`` one job runs at once (``fits`` holds)."""
        each = self.nthreads
        for pool, need in demand.items():
            if need > 0:
                each = min(each, self.supply[pool] // need)
        return max(1, each) * self.processes

    def describe(self) -> str:
        pools = describe_resources(dict(self.supply)) or "no resources"
        each = f"{self.nthreads} threads, {pools}"
        if self.processes == 1:
            return f"{self.name}: 1 worker of {each}"
        return f"{self.name}: {self.processes} workers of {each} each"


@dataclass(frozen=True, slots=True)
class Policy:
    """Bounds of an adaptive cluster; counts are workers (processes), as Dask's."""

    minimum: int = 0
    maximum: int = 1_000_000
    #: Jobs of one shape waiting in the batch queue (or being submitted) at most.
    backlog: int = 1
    #: Seconds a running job's workers may all sit idle before it is cancelled.
    idle_timeout: float = 300.0
    #: Failures in a row after which submission pauses, and for how long.
    max_failures: int = 3
    pause: float = 300.0

    def __post_init__(self) -> None:
        if not 0 <= self.minimum <= self.maximum:
            raise ValueError(
                f"adapt: need 0 <= minimum <= maximum, got minimum={self.minimum} "
                f"maximum={self.maximum}"
            )
        if self.backlog < 1:
            raise ValueError(f"adapt: backlog must be 1 or more, got {self.backlog}")
        if self.max_failures < 1:
            raise ValueError(f"adapt: max_failures must be 1 or more, got {self.max_failures}")


@dataclass(frozen=True, slots=True)
class Waiting:
    """One kind of waiting work: its demands (in order of preference) and count."""

    options: tuple[Mapping[str, int], ...]
    count: int
    restricted: bool = False

    def key(self) -> tuple[tuple[tuple[str, int], ...], ...]:
        return tuple(tuple(sorted(option.items())) for option in self.options)


@dataclass(frozen=True, slots=True)
class WorkerSeen:
    """A connected worker: the job that started it (None: not ours), tasks running."""

    name: str
    job: str | None
    running: int
    leaving: bool = False


# --- commands ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    shape: str


@dataclass(frozen=True, slots=True)
class Cancel:
    job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    """Something the user should know; ``level`` is a logging level name."""

    text: str
    level: str = "warning"


Command = Submit | Cancel | Report


@dataclass(slots=True)
class Job:
    """A job this allocator submitted, as last seen."""

    id: str
    shape: JobShape
    submitted: float
    #: "queued" (waiting for nodes), "running", or "cancelled" (by us, until it ends).
    state: str = "queued"
    #: Names of the workers it ever connected.
    workers: set[str] = field(default_factory=set)
    #: Since when every worker of it has been idle; None while one is busy.
    idle_since: float | None = None


def job_of_worker(name: str, prefix: str) -> str | None:
    """The job id in a worker name ``PREFIX-JOBID`` or ``PREFIX-JOBID-I`` (one process
    of several); None for a worker that is not one of ours."""
    head = f"{prefix}-"
    if not name.startswith(head):
        return None
    job = name[len(head) :].split("-", 1)[0]
    return job if job.isdigit() else None


class Allocator:
    """Decides submissions and cancellations; see the module docstring."""

    def __init__(self, shapes: Sequence[JobShape], policy: Policy | None = None) -> None:
        if not shapes:
            raise ValueError("a cluster that grows needs at least one job shape")
        names = [shape.name for shape in shapes]
        if len(set(names)) != len(names):
            raise ValueError(f"job shapes need distinct names, got {names}")
        self.shapes = {shape.name: shape for shape in shapes}
        self.first = shapes[0]
        self.policy = policy or Policy()
        #: A fixed number of workers (``scale``), or None to follow the work (``adapt``).
        self.target: int | None = 0
        self.jobs: dict[str, Job] = {}
        #: Submissions asked for and not yet answered, per shape.
        self.in_flight: dict[str, int] = dict.fromkeys(self.shapes, 0)
        self.failures = 0
        self.paused_until = 0.0
        self.last_failure = ""
        #: Kinds of work reported as fitting no shape (reported again only once gone).
        self.unsatisfiable: dict[tuple[tuple[tuple[str, int], ...], ...], str] = {}

    # --- what the user asks ----------------------------------------------------------

    def scale(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"scale: n must be 0 or more, got {n}")
        self.target = n

    def adapt(self, policy: Policy) -> None:
        self.policy = policy
        self.target = None

    # --- what the batch system answered --------------------------------------------------

    def submitted(self, now: float, shape: str, job: str) -> None:
        self.in_flight[shape] = max(0, self.in_flight[shape] - 1)
        self.jobs[job] = Job(job, self.shapes[shape], now)

    def submit_failed(self, now: float, shape: str, reason: str) -> list[Report]:
        self.in_flight[shape] = max(0, self.in_flight[shape] - 1)
        return self._failed(now, f"submitting a {shape} job failed: {reason}")

    def _failed(self, now: float, text: str) -> list[Report]:
        self.failures += 1
        self.last_failure = text
        out = [Report(text)]
        if self.failures >= self.policy.max_failures:
            self.paused_until = now + self.policy.pause
            self.failures = 0
            out.append(
                Report(
                    f"submission paused for {self.policy.pause:g} s after "
                    f"{self.policy.max_failures} failures in a row; the last: {text}"
                )
            )
        return out

    def paused(self, now: float) -> bool:
        return now < self.paused_until

    # --- the decision ----------------------------------------------------------------

    def step(
        self,
        now: float,
        waiting: Iterable[Waiting],
        workers: Iterable[WorkerSeen],
        states: Mapping[str, JobState],
    ) -> list[Command]:
        """Commands for now, given the waiting work, the connected workers and the batch
        system's state of each of our jobs (a job it no longer lists has ended)."""
        out = self._track(now, list(workers), states)
        if self.target is not None:
            return out + self._toward_target(self.target)
        need = self._need(list(waiting), out)
        out += self._grow(now, need)
        out += self._shrink(now, need)
        return out

    def _track(
        self, now: float, workers: list[WorkerSeen], states: Mapping[str, JobState]
    ) -> list[Command]:
        out: list[Command] = []
        by_job: dict[str, list[WorkerSeen]] = {}
        for worker in workers:
            if worker.job is not None:
                by_job.setdefault(worker.job, []).append(worker)
        for job in list(self.jobs.values()):
            state = states.get(job.id, JobState(ENDED, "gone"))
            mine = by_job.get(job.id, [])
            job.workers.update(w.name for w in mine)
            if job.workers and job.state != "cancelled":
                self.failures = 0  # a job that brought workers: submission works
            if state.phase == ENDED:
                del self.jobs[job.id]
                if job.state != "cancelled" and not job.workers:
                    out += self._failed(
                        now,
                        f"{job.shape.name} job {job.id} ended ({state.word}) before any "
                        "of its workers connected: see its output file",
                    )
                continue
            if state.phase == STUCK:
                if job.state != "cancelled":
                    text = (
                        f"{job.shape.name} job {job.id} is held in state {state.word} by the "
                        "batch system and would never run: cancelled (the batch system's "
                        "own view of the job says why)"
                    )
                    out += self._failed(now, text)
                    out.append(self._cancel(job, f"it is stuck in state {state.word}"))
                continue
            if job.state != "cancelled":
                job.state = "running" if state.phase == RUNNING else "queued"
            busy = any(w.running or w.leaving for w in mine)
            if busy or not mine:
                job.idle_since = None
            elif job.idle_since is None:
                job.idle_since = now
        return out

    def _need(self, waiting: list[Waiting], out: list[Command]) -> dict[str, float]:
        """Jobs of each shape the waiting work would fill; reports work that fits none."""
        need = dict.fromkeys(self.shapes, 0.0)
        seen = set()
        for kind in waiting:
            if kind.restricted or kind.count <= 0:
                continue  # bound to named workers: a new job cannot help
            key = kind.key()
            seen.add(key)
            choice = self._best(kind.options)
            if choice is None:
                if key not in self.unsatisfiable:
                    text = self._unsatisfiable_text(kind)
                    self.unsatisfiable[key] = text
                    out.append(Report(text))
                continue
            shape, option = choice
            need[shape.name] += kind.count / shape.slots(option)
        for key in set(self.unsatisfiable) - seen:
            del self.unsatisfiable[key]
        return need

    def _best(
        self, options: Sequence[Mapping[str, int]]
    ) -> tuple[JobShape, Mapping[str, int]] | None:
        best: tuple[int, int, JobShape, Mapping[str, int]] | None = None
        for order, shape in enumerate(self.shapes.values()):
            for option in options:
                if shape.fits(option):
                    unasked = sum(1 for pool in shape.supply if pool not in option)
                    if best is None or (unasked, order) < best[:2]:
                        best = (unasked, order, shape, option)
        return None if best is None else (best[2], best[3])

    def _unsatisfiable_text(self, kind: Waiting) -> str:
        asked = " or ".join(describe_resources(dict(o)) or "a thread" for o in kind.options)
        offered = "; ".join(shape.describe() for shape in self.shapes.values())
        return (
            f"{kind.count} task(s) ask for {asked}: no job shape offers it, so no job is "
            f"submitted for them (shapes: {offered})"
        )

    def _workers(self, jobs: Iterable[Job]) -> int:
        return sum(job.shape.processes for job in jobs)

    def _live(self) -> list[Job]:
        return [job for job in self.jobs.values() if job.state != "cancelled"]

    def _grow(self, now: float, need: Mapping[str, float]) -> list[Command]:
        if self.paused(now):
            return []
        out: list[Command] = []
        planned = self._workers(self._live()) + sum(
            n * self.shapes[s].processes for s, n in self.in_flight.items()
        )
        for shape in self.shapes.values():
            live = [job for job in self._live() if job.shape is shape]
            queued = sum(1 for job in live if job.state == "queued") + self.in_flight[shape.name]
            starting = sum(1 for job in live if job.state == "running" and not job.workers)
            wanted = math.ceil(need[shape.name] - 1e-9) - queued - starting
            count = min(wanted, self.policy.backlog - queued)
            if shape is self.first:  # the minimum is kept whatever the backlog
                count = max(count, math.ceil((self.policy.minimum - planned) / shape.processes))
            count = min(count, (self.policy.maximum - planned) // shape.processes)
            for _ in range(max(0, count)):
                out.append(self._submit(shape))
                planned += shape.processes
        return out

    def _submit(self, shape: JobShape) -> Submit:
        self.in_flight[shape.name] += 1
        return Submit(shape.name)

    def _shrink(self, now: float, need: Mapping[str, float]) -> list[Command]:
        out: list[Command] = []
        keep = self._workers(self._live())
        for shape in self.shapes.values():
            live = [job for job in self._live() if job.shape is shape]
            waiting = [job for job in live if job.state == "queued"]
            surplus = len(waiting) - math.ceil(need[shape.name] - 1e-9)
            for job in waiting[::-1][: max(0, surplus)]:  # newest first
                if keep - shape.processes >= self.policy.minimum:
                    out.append(self._cancel(job, "no waiting work needs it any more"))
                    keep -= shape.processes
        idle = self.policy.idle_timeout
        for job in self._live()[::-1]:
            idle_long = job.idle_since is not None and now - job.idle_since >= idle
            if idle_long and keep - job.shape.processes >= self.policy.minimum:
                out.append(self._cancel(job, f"its workers were idle for {idle:g} s"))
                keep -= job.shape.processes
        return out

    def _cancel(self, job: Job, reason: str) -> Cancel:
        job.state = "cancelled"
        return Cancel(job.id, reason)

    def _toward_target(self, target: int) -> list[Command]:
        shape = self.first
        live = self._live()
        have = self._workers(live) + sum(
            n * self.shapes[s].processes for s, n in self.in_flight.items()
        )
        if have < target:
            return [
                self._submit(shape) for _ in range(math.ceil((target - have) / shape.processes))
            ]
        out: list[Command] = []
        # Leave newest first, waiting jobs before running ones, idle before busy.
        order = sorted(live[::-1], key=lambda j: (j.state != "queued", j.idle_since is None))
        for job in order:
            if have - job.shape.processes < target:
                break
            out.append(self._cancel(job, f"scaled to {target} workers"))
            have -= job.shape.processes
        return out

    # --- for people ------------------------------------------------------------------

    def status(self, now: float) -> dict[str, object]:
        """Jobs by state, the pause and the work no shape fits, as plain data."""
        counts: dict[str, int] = {}
        for job in self.jobs.values():
            counts[job.state] = counts.get(job.state, 0) + 1
        return {
            "mode": "adaptive" if self.target is None else f"fixed at {self.target} workers",
            "jobs": {
                job.id: {
                    "shape": job.shape.name,
                    "state": job.state,
                    "workers": sorted(job.workers),
                }
                for job in self.jobs.values()
            },
            "counts": counts,
            "submitting": sum(self.in_flight.values()),
            "paused_for": max(0.0, self.paused_until - now),
            "last_failure": self.last_failure,
            "unsatisfiable": sorted(self.unsatisfiable.values()),
        }
