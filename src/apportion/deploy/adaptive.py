"""The service that grows and shrinks a cluster through a batch system: the allocator's loop.

Every ``interval`` seconds: ask the batch system the state of our jobs (``squeue``,
``qstat``), ask the scheduler what is waiting and who is connected
(``scheduler.backlog``), let the pure ``Allocator`` decide, and carry out its commands
(``sbatch``/``qsub``, ``scancel``/``qdel``, log lines). One tick runs to the end
before the next begins, so a job is always known to the allocator before the batch
system is next asked about it. A ``Batch`` is what differs between systems:
``SlurmBatch`` here, ``SGEBatch`` in ``deploy.sge_batch``.

Batch scripts and the job outputs go to the template's log directory; a job's
script is kept beside its output, so a failed job can be looked at and resubmitted
by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from apportion.deploy.allocator import (
    Allocator,
    Cancel,
    Command,
    JobState,
    Report,
    Submit,
    Waiting,
    WorkerSeen,
    job_of_worker,
)
from apportion.deploy.job_template import JobTemplate, parse_job_id, parse_states
from apportion.home import user_dir, write_private
from apportion.net.security import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, Security

logger = logging.getLogger("apportion.deploy")

#: What the scheduler says: waiting work and connected workers (``scheduler.backlog``).
Observation = tuple[list[dict[str, Any]], list[dict[str, Any]]]

#: Seconds a batch-system command may take before it counts as failed.
COMMAND_TIMEOUT = 60.0


class SubmitError(Exception):
    """The batch system refused a job; the text says why, in its words."""


async def run_command(*argv: str, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        env=dict(env) if env is not None else None,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return -1, "", f"{argv[0]} did not answer within {COMMAND_TIMEOUT:g} s"
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


class Batch(Protocol):
    """What ``Adaptive`` asks of a batch system."""

    @property
    def grant(self) -> str:
        """The word workers of its jobs are named by (``slurm-JOBID``, ``sge-JOBID``)."""
        ...

    def script(self, shape: str) -> str: ...

    async def submit(self, shape: str) -> str: ...

    async def states(self, jobs: Sequence[str]) -> dict[str, JobState] | None: ...

    async def cancel(self, job: str) -> None: ...


class ScriptBatch:
    """Jobs of these templates, each submitted as a script kept in its log directory;
    a subclass names the batch system's commands."""

    grant: ClassVar[str]
    #: The command that submits a script, and how to find the job id in its output.
    submit_command: ClassVar[tuple[str, ...]]

    def __init__(
        self,
        templates: Sequence[JobTemplate],
        scheduler_file: str,
        *,
        tls_files: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.templates = {t.name: t for t in templates}
        self.scheduler_file = scheduler_file
        self.tls_files = dict(tls_files or {})
        self.env = env
        self.user = getpass.getuser()

    def script(self, shape: str) -> str:
        return self.templates[shape].script(self.scheduler_file, self.tls_files)

    async def submit(self, shape: str) -> str:
        template = self.templates[shape]
        directory = user_dir(Path(template.log_directory or "."))
        path = directory / f"apportion-{shape}-{time.time_ns()}.sh"
        write_private(path, self.script(shape))  # never through a link planted there
        command = self.submit_command
        code, out, err = await run_command(*command, str(path), env=self.env)
        if code != 0:
            raise SubmitError((err or out).strip() or f"{command[0]} exited with status {code}")
        try:
            job = self.job_id(out)
        except ValueError as exc:
            raise SubmitError(str(exc)) from None
        with contextlib.suppress(OSError):
            path.rename(directory / f"apportion-{shape}-{job}.sh")
        return job

    def job_id(self, output: str) -> str:
        """The job id in what the submit command printed (``ValueError`` if none)."""
        raise NotImplementedError

    async def states(self, jobs: Sequence[str]) -> dict[str, JobState] | None:
        raise NotImplementedError

    async def cancel(self, job: str) -> None:
        raise NotImplementedError


class SlurmBatch(ScriptBatch):
    """``sbatch``, ``squeue`` and ``scancel`` for jobs of these templates."""

    grant = "slurm"
    submit_command = ("sbatch", "--parsable")

    def job_id(self, output: str) -> str:
        return parse_job_id(output)

    async def states(self, jobs: Sequence[str]) -> dict[str, JobState] | None:
        """Our jobs' states; None if squeue could not say (nothing is concluded then)."""
        if not jobs:
            return {}
        argv = ("squeue", "--noheader", "--format=%i %T", f"--user={self.user}")
        code, out, err = await run_command(*argv, env=self.env)
        if code != 0:
            logger.warning("squeue failed: %s", (err or out).strip())
            return None
        return {job: state for job, state in parse_states(out).items() if job in jobs}

    async def cancel(self, job: str) -> None:
        code, out, err = await run_command("scancel", job, env=self.env)
        if code != 0:
            logger.warning("scancel %s failed: %s", job, (err or out).strip())


def waiting_of(queued: list[dict[str, Any]]) -> list[Waiting]:
    return [Waiting(tuple(q["options"]), int(q["count"]), bool(q["restricted"])) for q in queued]


def workers_of(workers: list[dict[str, Any]], prefix: str) -> list[WorkerSeen]:
    return [
        WorkerSeen(
            w["name"],
            job_of_worker(w["name"], prefix),
            int(w["running"]),
            bool(w["leaving"]),
        )
        for w in workers
    ]


def credential_files(
    security: Security, directory: Path, stem: str
) -> tuple[dict[str, str], list[Path]]:
    """The ``APPORTION_TLS_*`` variables a worker job needs, as paths: PEM text given
    in memory is written to private files in ``directory`` (returned, to remove)."""
    variables: dict[str, str] = {}
    written: list[Path] = []
    cert, key = security.cert_for("worker")
    for variable, text, suffix in (
        (TLS_CERT_ENV, cert, "worker.pem"),
        (TLS_KEY_ENV, key, "worker.key"),
        (TLS_CA_ENV, security.tls_ca_file, "ca.pem"),
    ):
        if text:
            if "-----BEGIN" in text:
                target = directory / f"{stem}-{suffix}"
                write_private(target, text)
                written.append(target)
                text = str(target)
            variables[variable] = text
    return variables, written


class Adaptive:
    """Runs ``allocator`` against ``batch`` and what ``observe`` says, until stopped."""

    def __init__(
        self,
        allocator: Allocator,
        batch: Batch,
        observe: Callable[[], Awaitable[Observation]],
        *,
        interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.allocator = allocator
        self.batch = batch
        self.observe = observe
        self.interval = interval
        self.clock = clock
        #: Every report, newest last (``SlurmCluster.reports``, ``SGECluster.reports``).
        self.reports: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def wake(self) -> None:
        """Decide again now (after ``scale`` or ``adapt``) rather than at the next tick."""
        self._woken.set()

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one bad tick must not stop the cluster growing
                logger.warning("adaptive scaling: %s", str(exc) or type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), self.interval)
            self._woken.clear()

    async def tick(self) -> None:
        states = await self.batch.states(list(self.allocator.jobs))
        if states is None:
            return
        queued, workers = await self.observe()
        now = self.clock()
        seen = workers_of(workers, self.batch.grant)
        commands = self.allocator.step(now, waiting_of(queued), seen, states)
        await self.execute(commands)

    async def execute(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, Submit):
                await self._submit(command.shape)
            elif isinstance(command, Cancel):
                logger.info("cancelling job %s: %s", command.job, command.reason)
                await self.batch.cancel(command.job)
            elif isinstance(command, Report):
                self._report(command)

    async def _submit(self, shape: str) -> None:
        try:
            job = await self.batch.submit(shape)
        except (SubmitError, OSError) as exc:
            for report in self.allocator.submit_failed(self.clock(), shape, str(exc)):
                self._report(report)
            return
        logger.info("submitted %s job %s", shape, job)
        self.allocator.submitted(self.clock(), shape, job)

    def _report(self, report: Report) -> None:
        self.reports.append(report.text)
        logger.log(logging.getLevelName(report.level.upper()), "%s", report.text)

    async def stop(self, *, cancel_jobs: bool = True) -> None:
        """Stop deciding; cancel every job still ours unless told to leave them."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if cancel_jobs:
            for job in list(self.allocator.jobs):
                await self.batch.cancel(job)
