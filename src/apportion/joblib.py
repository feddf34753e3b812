"""joblib's ``Parallel`` on an apportion cluster: ``import apportion.joblib`` registers
the backend ``"apportion"``.

scikit-learn parallelises through joblib (``GridSearchCV``, ``cross_val_score``,
forests), so a search moves to the cluster without changing the estimator's code::

    import joblib
    import apportion.joblib  # registers the backend

    with joblib.parallel_config(backend="apportion", resources={"GPU": 1}):
        search.fit(X, y)

What joblib expects of a backend, and how this one meets it:

- Each batch joblib makes is one task; joblib's automatic batching sizes them
  (a batch of quick calls is one task, a long call is a task of its own).
- ``n_jobs=-1`` (the default here, as in Dask's backend) is the cluster's threads
  when the call starts; ``-2`` one fewer, as joblib counts; a positive ``n_jobs``
  is kept, and bounds how many batches joblib keeps in flight.
- Arguments that are large (``SCATTER_AT`` bytes or more: the training data, a
  fold's indices) are sent to the cluster once per ``Parallel`` call, and every task
  of the call refers to that copy; it is released when the call ends.
- A failure cancels the call's other tasks (joblib's ``abort_everything``), and the
  task's own exception is raised with its traceback.
- A ``Parallel`` inside a task runs on the same cluster through the worker's client,
  and the task secedes while it waits for its inner tasks (giving back its thread and
  resources), so nested calls cannot deadlock a worker whose threads are all busy.
- ``resources``, ``priority``, ``retries``, ``workers`` and ``allow_other_workers``
  given to the backend apply to every task of the calls it runs; nested calls inside
  them ask for no resources unless their own ``parallel_config`` says so.
- Each batch runs with its worker process's BLAS and OpenMP pools limited to one
  thread (``parallel_config(inner_max_num_threads=N)`` for N), as joblib's own
  process pool limits its children: unlimited, every process starts a thread per
  core and a search on a few cores runs several times slower.
- The client is the one given, else the current one (``get_client()``: inside a task,
  its worker's); where there is none, the backend starts ``Client()``, an embedded
  local cluster sized to this machine, once, and keeps it for later calls (Dask's
  backend raises instead: the first ``GridSearchCV`` should just run).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import joblib
from joblib.parallel import AutoBatchingMixin, ParallelBackendBase

from apportion.worker.context import in_task, rejoin, secede, seceded
from apportion.worker.sizeof import sizeof

if TYPE_CHECKING:
    from apportion.client.client import Client
    from apportion.client.future import Future

logger = logging.getLogger("apportion.joblib")

#: The name ``parallel_config(backend=...)`` and ``Parallel(backend=...)`` take.
BACKEND_NAME = "apportion"

#: Arguments this large (bytes, estimated) are scattered once per call rather than
#: pickled into every task that takes them: above it, one round trip to store the
#: value costs less than carrying it through the scheduler in each task.
SCATTER_AT = 64 * 1024

#: Keywords of ``client.submit`` the backend passes to every task.
TASK_KEYWORDS = frozenset({"resources", "priority", "retries", "workers", "allow_other_workers"})

#: Seconds ``effective_n_jobs`` waits for a first worker on a cluster that has none.
WAIT_FOR_WORKERS = 30.0


def run_batch(
    calls: Sequence[tuple[Callable[..., Any], Sequence[Any], Mapping[str, Any]]],
    nesting_level: int,
    inner_threads: int | None = 1,
) -> list[Any]:
    """One batch of joblib's calls, in order, on a worker: the task every batch is.

    A ``Parallel`` inside one of them runs on the cluster too (joblib asks its
    active backend for the nested one). While it runs, the BLAS and OpenMP pools of
    the worker process use ``inner_threads`` threads (``_INNER``).
    """
    nested = ApportionBackend(nesting_level=nesting_level)
    with _INNER.limited(inner_threads), joblib.parallel_config(backend=nested):
        return [func(*args, **kwargs) for func, args, kwargs in calls]


class _InnerThreads:
    """The threads of a worker process's BLAS and OpenMP pools while batches run.

    NumPy's BLAS starts a thread per core in every process; two worker processes of
    one thread each on two cores would then run four BLAS threads, and a grid search
    runs several times slower than on joblib's own process pool, which limits its
    children to ``cores // n_jobs`` threads (Dask's workers start with one).

    Each batch sets the limit on its own thread and restores it there (a restore
    from another thread does not take for OpenBLAS). OpenMP's limit is the
    thread's own; OpenBLAS's reaches the whole process, so while batches overlap
    the last one to restore may restore another's limit: the process can keep it
    after the call. threadpoolctl's controller lists the loaded libraries (a
    millisecond), so it is kept, and made again when modules were imported since.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._controller: Any = None
        self._modules = 0

    @contextlib.contextmanager
    def limited(self, threads: int | None) -> Iterator[None]:
        controller = None if threads is None else self._current()
        if controller is None:
            yield
            return
        limits = controller.limit(limits=threads)
        try:
            yield
        finally:
            limits.restore_original_limits()

    def _current(self) -> Any:
        """threadpoolctl's controller of the libraries loaded now; None without
        threadpoolctl (scikit-learn brings it; without it nothing is limited)."""
        with self._lock:
            if self._controller is None or len(sys.modules) != self._modules:
                try:
                    from threadpoolctl import ThreadpoolController
                except ImportError:
                    return None
                self._modules = len(sys.modules)
                self._controller = ThreadpoolController()
            return self._controller


_INNER = _InnerThreads()


class ApportionBackend(AutoBatchingMixin, ParallelBackendBase):  # type: ignore[misc]
    """joblib's backend protocol over an apportion client (see the module's docstring).

    joblib calls ``configure`` and ``start_call`` from the thread running
    ``Parallel``, then ``submit`` from that thread and from the client's callback
    thread (as batches finish and joblib dispatches more), and ``stop_call`` at
    the end; ``abort_everything`` after a failure.
    """

    # Batches of at least a fifth of a second hide a task's round trip; at most a
    # second keeps the last batches from straggling (Dask's backend's figures).
    MIN_IDEAL_BATCH_DURATION = 0.2
    MAX_IDEAL_BATCH_DURATION = 1.0

    default_n_jobs = -1
    supports_retrieve_callback = True
    supports_inner_max_num_threads = True
    uses_threads = False
    supports_sharedmem = False

    def __init__(
        self,
        client: Client | None = None,
        *,
        scatter_at: int = SCATTER_AT,
        wait_for_workers_timeout: float = WAIT_FOR_WORKERS,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        **task_keywords: Any,
    ) -> None:
        unknown = set(task_keywords) - TASK_KEYWORDS
        if unknown:
            raise TypeError(
                f"the apportion joblib backend does not take {sorted(unknown)}; it takes "
                f"client, scatter_at, wait_for_workers_timeout and {sorted(TASK_KEYWORDS)}"
            )
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self._given = client
        self._client: Client | None = client
        self._scatter_at = scatter_at
        self._wait_for_workers = wait_for_workers_timeout
        #: Every task is a distinct call, even with equal arguments (joblib may run
        #: the same call twice on purpose, e.g. a random estimator).
        self._keywords: dict[str, Any] = {**task_keywords, "pure": False}
        self._lock = threading.Lock()
        #: The large arguments scattered during the current call: id -> (the value,
        #: kept so that its id is not reused, and its future). Emptied when the call
        #: ends, which lets the cluster drop them.
        self._scattered: dict[int, tuple[Any, Future]] = {}
        #: The current call's tasks not yet collected (weak: a batch's future goes
        #: once joblib has its result, and its result on the cluster with it).
        self._in_flight: weakref.WeakSet[Future] = weakref.WeakSet()

    def __reduce__(self) -> tuple[type[ApportionBackend], tuple[()]]:
        # A client cannot travel; on the other side the backend finds its own.
        return (ApportionBackend, ())

    # --- the client ------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The client the tasks go through (found or started on first use)."""
        if self._client is None or self._client._closed:
            self._client = self._given if self._given is not None else _current_or_embedded()
        return self._client

    # --- joblib's protocol ----------------------------------------------------------

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """How many batches can run at once: the cluster's threads for ``-1``."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is not None and n_jobs > 0:
            return n_jobs
        threads = self._threads()
        return max(1, threads + 1 + (n_jobs or -1))

    def configure(self, n_jobs: int = 1, parallel: Any = None, **backend_kwargs: Any) -> int:
        """Ready for a call of ``parallel``: joblib's options for process pools
        (``max_nbytes``, ``temp_folder``, ``mmap_mode``) have no meaning here."""
        del backend_kwargs
        self.parallel = parallel
        return self.effective_n_jobs(n_jobs)

    def start_call(self) -> None:
        """A ``Parallel`` call begins: nothing of it is scattered yet."""
        with self._lock:
            self._scattered = {}

    def stop_call(self) -> None:
        """The call ended: its scattered values are let go."""
        with self._lock:
            self._scattered = {}  # the cluster drops the call's scattered values

    def submit(self, func: Any, callback: Callable[[Any], Any] | None = None) -> Future:
        """Run joblib's batch ``func`` as one task; ``callback(future)`` when it ends."""
        calls = [
            (f, self._shared(args), self._shared_kwargs(kwargs)) for f, args, kwargs in func.items
        ]
        first = calls[0][0] if calls else run_batch
        name = getattr(first, "__name__", type(first).__name__)
        key = f"{name}-{self.client._unique_name()}"
        level = (self.nesting_level or 0) + 1
        inner = 1 if self.inner_max_num_threads is None else self.inner_max_num_threads
        future = self.client.submit(run_batch, calls, level, inner, key=key, **self._keywords)
        self._in_flight.add(future)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def retrieve_result_callback(self, out: Future) -> Any:
        """The batch's results, on the client's callback thread; its exception raised."""
        return out.result()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Cancel the call's tasks that are still queued or running: joblib raises
        the first failure and will never read them."""
        del ensure_ready  # the cluster stays as it was either way
        pending = [f for f in list(self._in_flight) if not f.done()]
        if pending:
            self.client.cancel(pending)

    def get_nested_backend(self) -> tuple[ApportionBackend, int | None]:
        """Inner calls run on the cluster as well, with no resources of their own."""
        return ApportionBackend(nesting_level=(self.nesting_level or 0) + 1), None

    @contextlib.contextmanager
    def retrieval_context(self) -> Iterator[None]:
        """Inside a task, secede while joblib waits for the inner call's tasks, so its
        thread and resources serve them meanwhile (else nested calls deadlock)."""
        if not in_task() or seceded():
            yield
            return
        secede()
        try:
            yield
        finally:
            rejoin()

    # --- the pieces -----------------------------------------------------------------

    def _threads(self) -> int:
        client = self.client
        threads = sum(client.nthreads().values())
        if threads:
            return int(threads)
        try:
            client.wait_for_workers(1, timeout=self._wait_for_workers)
        except TimeoutError:
            raise TimeoutError(
                f"the apportion joblib backend found no worker on {client.scheduler_address} "
                f"in {self._wait_for_workers:g}s; start workers, or pass another client"
            ) from None
        return int(sum(client.nthreads().values()))

    def _shared(self, args: Sequence[Any]) -> list[Any]:
        return [self._shared_one(arg) for arg in args]

    def _shared_kwargs(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {name: self._shared_one(value) for name, value in kwargs.items()}

    def _shared_one(self, arg: Any) -> Any:
        """``arg``, or the future of its one copy on the cluster when it is large."""
        if _is_small(arg) or sizeof(arg) < self._scatter_at:
            return arg
        with self._lock:
            held = self._scattered.get(id(arg))
            if held is not None and held[0] is arg:
                return held[1]
            # Scattered under the lock: two batches taking the same array (the
            # callback thread and the caller's) store it once.
            [future] = self.client.scatter([arg], hash=False)
            self._scattered[id(arg)] = (arg, future)
            return future


def _is_small(arg: Any) -> bool:
    """Values never worth a look (most arguments are these)."""
    return arg is None or isinstance(arg, int | float | str | bool | type)


def _current_or_embedded() -> Client:
    from apportion.client.task_client import current_or_embedded

    return current_or_embedded("joblib")


joblib.register_parallel_backend(BACKEND_NAME, ApportionBackend)
