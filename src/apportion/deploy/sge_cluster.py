"""``SGECluster``: a scheduler here, worker jobs through Grid Engine's ``qsub``.

dask-jobqueue's ``SGECluster`` in apportion's terms: ``SGECluster(cores=4,
memory="16GiB", pe="smp", queue="all.q", walltime="02:00:00")`` describes one worker
job (``SGEJobTemplate``); ``cluster.scale(4)`` asks for four workers and
``cluster.adapt(minimum=0, maximum=20)`` lets the waiting work decide, asking for a
job only of a shape that work fits (a GPU task brings a ``-l gpu=1`` job, nothing
else does). The scheduler, its files, scaling and closing are ``BatchCluster``'s,
as for ``SlurmCluster``; the allocator deciding is the same one.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from apportion.deploy.batch_cluster import BatchCluster
from apportion.deploy.job_template import JobTemplate
from apportion.deploy.sge_batch import SGEBatch
from apportion.deploy.sge_template import SGEJobTemplate
from apportion.net.security import Security


class SGECluster(BatchCluster):
    """A scheduler on this host and worker jobs submitted with ``qsub``.

    The keyword arguments describe the default job (``SGEJobTemplate``: ``cores``
    (slots of ``pe``), ``memory``, ``processes``, ``gpus`` (the consumable
    ``gpu_resource``), ``resources``, ``walltime``, ``queue``, ``pe``,
    ``resource_spec``, ``project``, ``job_extra_directives`` (or ``job_extra``),
    ``job_script_prologue``, ``worker_extra_args``, ``python``, ``environment``
    (exported by the script: Grid Engine does not pass the submitter's environment
    on)); ``templates`` adds other kinds of job.
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
        pe: str | None = None,
        resource_spec: str | None = None,
        project: str | None = None,
        gpu_resource: str = "gpu",
        job_extra_directives: Sequence[str] = (),
        job_extra: Sequence[str] | None = None,
        job_script_prologue: Sequence[str] = (),
        worker_extra_args: Sequence[str] = (),
        python: str = sys.executable,
        environment: dict[str, str] | None = None,
        name: str = "default",
        templates: Sequence[JobTemplate] = (),
        log_directory: str | os.PathLike[str] = "apportion-sge",
        host: str | None = None,
        scheduler_port: int = 0,
        security: Security | None = None,
        n_workers: int = 0,
        interval: float = 2.0,
    ) -> None:
        directory = Path(log_directory).absolute()
        default = SGEJobTemplate(
            name=name,
            cores=cores,
            memory=memory,
            processes=processes,
            gpus=gpus,
            resources=resources,
            walltime=walltime,
            queue=queue,
            pe=pe,
            resource_spec=resource_spec,
            project=project,
            gpu_resource=gpu_resource,
            job_extra_directives=[*job_extra_directives, *(job_extra or ())],
            job_script_prologue=job_script_prologue,
            python=python,
            worker_extra_args=worker_extra_args,
            environment=dict(environment or {}),
            log_directory=str(directory),
        )
        own = str(directory)
        every: list[JobTemplate] = [default]
        every += [
            t if t.log_directory else dataclasses.replace(t, log_directory=own) for t in templates
        ]

        def make_batch(
            templates: Sequence[JobTemplate], scheduler_file: str, tls: dict[str, str]
        ) -> SGEBatch:
            return SGEBatch(templates, scheduler_file, tls_files=tls)

        super().__init__(
            every,
            make_batch,
            directory,
            host=host,
            scheduler_port=scheduler_port,
            security=security,
            n_workers=n_workers,
            interval=interval,
        )
