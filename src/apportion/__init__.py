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

import builtins
import concurrent.futures

from apportion.client import session as _session
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
from apportion.deploy import local as _local
from apportion.deploy.cluster_options import IgnoredOptionWarning
from apportion.deploy.job_template import JobTemplate
from apportion.deploy.local import LocalCluster
from apportion.deploy.slurm_cluster import SlurmCluster
from apportion.deploy.ssh import SSHCluster
from apportion.net.security import Security
from apportion.plugins import UploadDirectory, WorkerPlugin

# Every process must decode the job queue's messages (a scheduler forwards them to
# the queue unread) and every process runs this first; ``protocol`` may not import them.
from apportion.runs import messages as _runs_messages  # noqa: F401
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

__version__ = "0.1.0"

# At exit, clients close before the clusters they use, so that none reports its
# scheduler lost; ``deploy`` runs this without importing the client.
_local.close_first.append(_session.close_all)

#: Dask's names for the same exceptions, so ``except CancelledError`` and
#: ``except KilledWorker`` written for Dask catch apportion's failures.
CancelledError = concurrent.futures.CancelledError
KilledWorker = WorkerCrashedError
#: Dask's base class of actor call outcomes; here there is one kind.
BaseActorFuture = ActorFuture
#: What Dask exports as ``distributed.TimeoutError``: Python's own.
TimeoutError = builtins.TimeoutError

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
    "Pub",
    "Queue",
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
