"""apportion: a distributed task scheduler that places tasks where their resources are free.

The names follow Dask.distributed, so code written for it runs with the import changed::

    from apportion import Client
    client = Client()                      # an embedded cluster sized to this machine
    fut = client.submit(train, cfg, resources={"GPU": 1})
    fut.result()

Inside a task, ``task_resources()`` says what it holds (``{"gpu": [2, 3]}`` for units
of an indexed pool) and ``task_environment()`` is the environment to start processes
with, so that they use only those units (``CUDA_VISIBLE_DEVICES=2,3``).
"""

# Names load on first use (PEP 562), so that a process imports only what it uses: a
# worker process runs ``apportion.cli.main``, so ``apportion`` first, and must not pay
# for the client, the deployments and the scheduler. The type checker reads the
# imports under ``TYPE_CHECKING``, which name everything in ``__all__``.

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import builtins
    import concurrent.futures

    from apportion.client.actors import Actor, ActorFuture
    from apportion.client.channels import Pub, Queue, Sub, Variable
    from apportion.client.client import Client, default_client
    from apportion.client.coordination import fire_and_forget
    from apportion.client.errors import (
        FutureCancelledError,
        LostDataError,
        OutOfMemoryError,
        SchedulerGoneError,
        SerializationError,
        UnknownResourceError,
        UnsatisfiableError,
        WorkerCrashedError,
    )
    from apportion.client.future import Future
    from apportion.client.locks import Event, Lock, MultiLock, Semaphore
    from apportion.client.pool import Pool
    from apportion.client.progress import progress
    from apportion.client.recorders import get_task_stream, performance_report
    from apportion.client.task_client import get_client, local_client, worker_client
    from apportion.client.waiting import (
        ALL_COMPLETED,
        FIRST_COMPLETED,
        as_completed,
        futures_of,
        wait,
    )
    from apportion.core.resources import parse_resources
    from apportion.deploy.cluster_options import IgnoredOptionWarning
    from apportion.deploy.job_template import JobTemplate
    from apportion.deploy.local import LocalCluster
    from apportion.deploy.sge_cluster import SGECluster
    from apportion.deploy.sge_template import SGEJobTemplate
    from apportion.deploy.slurm_cluster import SlurmCluster
    from apportion.deploy.ssh import SSHCluster
    from apportion.net.security import Security
    from apportion.plugins import UploadDirectory, WorkerPlugin
    from apportion.scheduler.service import Scheduler
    from apportion.worker.context import (
        rejoin,
        secede,
        task_cancel_event,
        task_environment,
        task_key,
        task_resources,
        task_variant,
    )
    from apportion.worker.printing import print, warn
    from apportion.worker.service import Worker, get_worker

    #: Dask's names for the same exceptions, so ``except CancelledError`` and
    #: ``except KilledWorker`` written for Dask catch apportion's failures.
    CancelledError = concurrent.futures.CancelledError
    KilledWorker = WorkerCrashedError
    #: Dask's base class of actor call outcomes; here there is one kind.
    BaseActorFuture = ActorFuture
    #: What Dask exports as ``distributed.TimeoutError``: Python's own.
    TimeoutError = builtins.TimeoutError

__version__ = "0.1.0"

#: Public name -> (module, name there). ``CancelledError``, ``KilledWorker``,
#: ``BaseActorFuture`` and ``TimeoutError`` are Dask's names for ours or Python's.
_SOURCES: dict[str, tuple[str, str]] = {
    "ALL_COMPLETED": ("apportion.client.waiting", "ALL_COMPLETED"),
    "Actor": ("apportion.client.actors", "Actor"),
    "ActorFuture": ("apportion.client.actors", "ActorFuture"),
    "BaseActorFuture": ("apportion.client.actors", "ActorFuture"),
    "CancelledError": ("concurrent.futures", "CancelledError"),
    "Client": ("apportion.client.client", "Client"),
    "Event": ("apportion.client.locks", "Event"),
    "FIRST_COMPLETED": ("apportion.client.waiting", "FIRST_COMPLETED"),
    "Future": ("apportion.client.future", "Future"),
    "FutureCancelledError": ("apportion.client.errors", "FutureCancelledError"),
    "IgnoredOptionWarning": ("apportion.deploy.cluster_options", "IgnoredOptionWarning"),
    "JobTemplate": ("apportion.deploy.job_template", "JobTemplate"),
    "KilledWorker": ("apportion.client.errors", "WorkerCrashedError"),
    "LocalCluster": ("apportion.deploy.local", "LocalCluster"),
    "Lock": ("apportion.client.locks", "Lock"),
    "LostDataError": ("apportion.client.errors", "LostDataError"),
    "MultiLock": ("apportion.client.locks", "MultiLock"),
    "OutOfMemoryError": ("apportion.client.errors", "OutOfMemoryError"),
    "Pool": ("apportion.client.pool", "Pool"),
    "Pub": ("apportion.client.channels", "Pub"),
    "Queue": ("apportion.client.channels", "Queue"),
    "SGECluster": ("apportion.deploy.sge_cluster", "SGECluster"),
    "SGEJobTemplate": ("apportion.deploy.sge_template", "SGEJobTemplate"),
    "SSHCluster": ("apportion.deploy.ssh", "SSHCluster"),
    "Scheduler": ("apportion.scheduler.service", "Scheduler"),
    "SchedulerGoneError": ("apportion.client.errors", "SchedulerGoneError"),
    "Security": ("apportion.net.security", "Security"),
    "Semaphore": ("apportion.client.locks", "Semaphore"),
    "SerializationError": ("apportion.client.errors", "SerializationError"),
    "SlurmCluster": ("apportion.deploy.slurm_cluster", "SlurmCluster"),
    "Sub": ("apportion.client.channels", "Sub"),
    "TimeoutError": ("builtins", "TimeoutError"),
    "UnknownResourceError": ("apportion.client.errors", "UnknownResourceError"),
    "UnsatisfiableError": ("apportion.client.errors", "UnsatisfiableError"),
    "UploadDirectory": ("apportion.plugins", "UploadDirectory"),
    "Variable": ("apportion.client.channels", "Variable"),
    "Worker": ("apportion.worker.service", "Worker"),
    "WorkerCrashedError": ("apportion.client.errors", "WorkerCrashedError"),
    "WorkerPlugin": ("apportion.plugins", "WorkerPlugin"),
    "as_completed": ("apportion.client.waiting", "as_completed"),
    "default_client": ("apportion.client.client", "default_client"),
    "fire_and_forget": ("apportion.client.coordination", "fire_and_forget"),
    "futures_of": ("apportion.client.waiting", "futures_of"),
    "get_client": ("apportion.client.task_client", "get_client"),
    "get_task_stream": ("apportion.client.recorders", "get_task_stream"),
    "get_worker": ("apportion.worker.service", "get_worker"),
    "local_client": ("apportion.client.task_client", "local_client"),
    "parse_resources": ("apportion.core.resources", "parse_resources"),
    "performance_report": ("apportion.client.recorders", "performance_report"),
    "print": ("apportion.worker.printing", "print"),
    "progress": ("apportion.client.progress", "progress"),
    "rejoin": ("apportion.worker.context", "rejoin"),
    "secede": ("apportion.worker.context", "secede"),
    "task_cancel_event": ("apportion.worker.context", "task_cancel_event"),
    "task_environment": ("apportion.worker.context", "task_environment"),
    "task_key": ("apportion.worker.context", "task_key"),
    "task_resources": ("apportion.worker.context", "task_resources"),
    "task_variant": ("apportion.worker.context", "task_variant"),
    "wait": ("apportion.client.waiting", "wait"),
    "warn": ("apportion.worker.printing", "warn"),
    "worker_client": ("apportion.client.task_client", "worker_client"),
}

#: Loading a name from these packages loads the client too, as importing ``apportion``
#: did before names loaded lazily: ``LocalCluster.get_client`` needs it, and a client
#: registers its sessions to close at exit before the clusters do.
_WITH_CLIENT = ("apportion.client.", "apportion.deploy.")


if not TYPE_CHECKING:  # hidden from mypy, so that a misspelt name is still an error

    def __getattr__(name: str) -> Any:
        """Load a public name on first use and keep it, as an import would have."""
        try:
            module_name, attribute = _SOURCES[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        if module_name.startswith(_WITH_CLIENT):
            importlib.import_module("apportion.client.client")
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    """The module's names, those not loaded yet included."""
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "ALL_COMPLETED",
    "FIRST_COMPLETED",
    "Actor",
    "ActorFuture",
    "BaseActorFuture",
    "CancelledError",
    "Client",
    "Event",
    "Future",
    "FutureCancelledError",
    "IgnoredOptionWarning",
    "JobTemplate",
    "KilledWorker",
    "LocalCluster",
    "Lock",
    "LostDataError",
    "MultiLock",
    "OutOfMemoryError",
    "Pool",
    "Pub",
    "Queue",
    "SGECluster",
    "SGEJobTemplate",
    "SSHCluster",
    "Scheduler",
    "SchedulerGoneError",
    "Security",
    "Semaphore",
    "SerializationError",
    "SlurmCluster",
    "Sub",
    "TimeoutError",
    "UnknownResourceError",
    "UnsatisfiableError",
    "UploadDirectory",
    "Variable",
    "Worker",
    "WorkerCrashedError",
    "WorkerPlugin",
    "__version__",
    "as_completed",
    "default_client",
    "fire_and_forget",
    "futures_of",
    "get_client",
    "get_task_stream",
    "get_worker",
    "local_client",
    "parse_resources",
    "performance_report",
    "print",
    "progress",
    "rejoin",
    "secede",
    "task_cancel_event",
    "task_environment",
    "task_key",
    "task_resources",
    "task_variant",
    "wait",
    "warn",
    "worker_client",
]
