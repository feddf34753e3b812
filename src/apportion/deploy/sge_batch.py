"""``qsub``, ``qstat`` and ``qdel`` for worker jobs: Grid Engine's ``Batch``.

The script is written to the template's log directory and submitted with ``qsub
-terse`` (which prints the job id alone); ``qstat -u USER`` lists our jobs' states
(a job it no longer lists has ended, as ``squeue``'s for Slurm), and ``qdel``
cancels one: Grid Engine sends its processes SIGTERM, then SIGKILL after the
execution host's ``notify`` time, and the workers drain on the SIGTERM.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from apportion.deploy.adaptive import ScriptBatch, run_command
from apportion.deploy.allocator import JobState
from apportion.deploy.sge_template import SGEJobTemplate, parse_qstat, parse_qsub_job_id

logger = logging.getLogger("apportion.deploy")


class SGEBatch(ScriptBatch):
    """``qsub``, ``qstat`` and ``qdel`` for jobs of these templates."""

    grant = SGEJobTemplate.GRANT
    submit_command = ("qsub", "-terse")

    def job_id(self, output: str) -> str:
        return parse_qsub_job_id(output)

    async def states(self, jobs: Sequence[str]) -> dict[str, JobState] | None:
        """Our jobs' states; None if qstat could not say (nothing is concluded then)."""
        if not jobs:
            return {}
        code, out, err = await run_command("qstat", "-u", self.user, env=self.env)
        if code != 0:
            logger.warning("qstat failed: %s", (err or out).strip())
            return None
        return {job: state for job, state in parse_qstat(out).items() if job in jobs}

    async def cancel(self, job: str) -> None:
        code, out, err = await run_command("qdel", job, env=self.env)
        if code != 0:
            logger.warning("qdel %s failed: %s", job, (err or out).strip())
