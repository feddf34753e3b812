"""``SlurmCluster``: a scheduler here, worker jobs through ``sbatch``, sized by the work.

In dask-jobqueue's words: ``SlurmCluster(cores=8, memory="32GiB", walltime="02:00:00")``
describes one worker job; ``cluster.scale(4)`` asks for four workers, and
``cluster.adapt(minimum=0, maximum=20)`` lets the work decide. Unlike a load-only
adaptive cluster it asks for a job only of a shape the waiting work fits: with
``gpus=1`` and a second template for CPU work (``templates=[JobTemplate(...)]``),
GPU tasks bring GPU jobs and nothing else does (``deploy.allocator``). Everything
but the templates and the batch commands is ``BatchCluster``'s.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from apportion.deploy.adaptive import SlurmBatch
from apportion.deploy.batch_cluster import BatchCluster
from apportion.deploy.job_template import JobTemplate
from apportion.net.security import Security


class SlurmCluster(BatchCluster):
    """A scheduler on this host and worker jobs submitted with ``sbatch``.

    The keyword arguments describe the default job (``JobTemplate``: ``cores``,
    ``memory``, ``processes``, ``gpus``, ``resources``, ``walltime``, ``queue``,
    ``account``, ``job_extra_directives`` (or ``job_extra``), ``job_script_prologue``,
    ``worker_extra_args``, ``python``); ``templates`` adds other kinds of job.
    """

    def __init__(
        self,
        cores: int = 1,
        memory: str | None = None,
        processes: int = 1,
        *,
        gpus: int = 0,
        resources: str = "",
        walltime: str = "01:00:00",
        queue: str | None = None,
        account: str | None = None,
        job_extra_directives: Sequence[str] = (),
        job_extra: Sequence[str] | None = None,
        job_script_prologue: Sequence[str] = (),
        worker_extra_args: Sequence[str] = (),
        python: str = sys.executable,
        name: str = "default",
        templates: Sequence[JobTemplate] = (),
        log_directory: str | os.PathLike[str] = "apportion-slurm",
        host: str | None = None,
        scheduler_port: int = 0,
        security: Security | None = None,
        n_workers: int = 0,
        interval: float = 2.0,
    ) -> None:
        directory = Path(log_directory).absolute()
        default = JobTemplate(
            name=name,
            cores=cores,
            memory=memory,
            processes=processes,
            gpus=gpus,
            resources=resources,
            walltime=walltime,
            queue=queue,
            account=account,
            job_extra_directives=[*job_extra_directives, *(job_extra or ())],
            job_script_prologue=job_script_prologue,
            python=python,
            worker_extra_args=worker_extra_args,
            log_directory=str(directory),
        )
        own = str(directory)
        templates = [default] + [
            t if t.log_directory else dataclasses.replace(t, log_directory=own) for t in templates
        ]

        def make_batch(
            templates: Sequence[JobTemplate], scheduler_file: str, tls: dict[str, str]
        ) -> SlurmBatch:
            return SlurmBatch(templates, scheduler_file, tls_files=tls)

        super().__init__(
            templates,
            make_batch,
            directory,
            host=host,
            scheduler_port=scheduler_port,
            security=security,
            n_workers=n_workers,
            interval=interval,
        )
