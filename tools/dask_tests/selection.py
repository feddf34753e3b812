"""Which of Dask.distributed's tests the harness runs, and which it leaves out and why.

The selection is Dask's synchronous tests (plain ``def test_*``, not the in-process
``gen_cluster``/``gen_test`` coroutines) in the files below, less those that read Dask's
internals: its scheduler or worker objects, functions run with ``dask_worker=`` or
``dask_scheduler=``, the Tornado IOLoop, the nanny, private attributes, its logging
handlers or its widget cache. Each one left out is named in ``INTERNALS`` with the
internal it reads, so the list can be checked against Dask's source.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

FILES = (
    "distributed/tests/test_client.py",
    "distributed/tests/test_as_completed.py",
    "distributed/tests/test_actor.py",
    "distributed/deploy/tests/test_local.py",
    "distributed/diagnostics/tests/test_progressbar.py",
    "distributed/tests/test_publish.py",
    "distributed/tests/test_client_executor.py",
    "distributed/tests/test_worker_client.py",
    "distributed/tests/test_failed_workers.py",
    "distributed/tests/test_locks.py",
    "distributed/tests/test_queues.py",
    "distributed/tests/test_variable.py",
    "distributed/tests/test_semaphore.py",
    "distributed/tests/test_events.py",
    "distributed/diagnostics/tests/test_task_stream.py",
    "distributed/tests/test_dask_collections.py",
)

# Each test left out, and under it the Dask internal it reads.
_LEFT_OUT = """
test_client::test_rebalance_sync
    the in-process workers' `.data`
test_client::test_open_close_many_workers
    Dask's Worker and Nanny objects on its IOLoop, `Status`
test_client::test_quiet_client_close
    the scheduler object's `tasks`
test_client::test_get_client_no_cluster
    `Worker._instances`
test_client::test_no_threads_lingering
    `threading._active` (and Dask marks it xfail)
test_client::test_direct_to_workers
    `dask_scheduler.get_events()`
test_client::test_release_persisted_collection_sync
    `dask_scheduler.tasks`
test_client::test_worker_clients_do_not_claim_ownership_of_serialize_futures
    `dask_scheduler.tasks`
test_client::test_global_clients
    `distributed.client._get_global_client`
test_client::test_no_future_references
    `distributed.profile.lock`
test_client::test_computation_code_walk_frames
    `Client._get_computation_code`
test_client::test_computation_object_code_dask_compute
    `dask_scheduler.computations`
test_client::test_computation_object_code_dask_compute_no_frames_default
    `dask_scheduler.computations`
test_client::test_computation_object_code_not_available
    `dask_scheduler.computations`
test_as_completed::test_as_completed_cancel_last
    the client's Tornado IOLoop (`client.loop.add_callback`)
test_actor::test_compute_sync
    `dask_worker.data` and `dask_worker.actors`
test_actor::test_worker_actor_handle_is_weakref_sync
    `dask_worker.data` and `dask_worker.actors`
test_actor::test_worker_actor_handle_is_weakref_from_compute_sync
    `dask_worker.data` and `dask_worker.actors`
test_local::test_simple
    the scheduler object's `tasks`, the workers' `.data`, `Client.loop is cluster.loop`
test_local::test_procs
    the cluster's Worker and Nanny objects (`w.state.nthreads`)
test_local::test_transports_inproc
    Dask's in-process transport and worker objects
test_local::test_move_unserializable_data
    Dask's in-process transport and worker objects
test_local::test_transports_tcp
    the cluster's worker objects (`cluster.workers[0].address`)
test_local::test_transports_tcp_port
    the cluster's worker objects (`cluster.workers[0].address`)
test_local::test_local_cluster_supports_blocked_handlers
    the names of Dask's scheduler handlers
test_local::test_only_local_access
    Dask's comm layer, run with `sync(loop, ...)`
test_local::test_remote_access
    Dask's comm layer, run with `sync(loop, ...)`
test_local::test_local_tls
    Dask's comm layer, run with `sync(loop, ...)`
test_local::test_bokeh
    the scheduler object's Bokeh `http_server` and its `/status/` page
test_local::test_memory
    the in-process workers' `memory_manager`
test_local::test_io_loop_periodic_callbacks
    the scheduler object's IOLoop and `periodic_callbacks`
test_local::test_logging
    the scheduler object's `_deque_handler`
test_local::test_ipywidgets
    the cluster's `_cached_widget`
test_local::test_ipywidgets_loop
    the cluster's `_cached_widget` and Tornado's IOLoop
test_local::test_adapt
    the cluster's `_adaptive`
test_local::test_worker_class_worker
    subclasses Dask's `Worker` and runs it in process
test_local::test_worker_class_nanny
    subclasses Dask's `Nanny`
test_local::test_localcluster_start_exception
    the Nanny's start-up errors
test_local::test_Client_solo
    `distributed.core.Status`
test_local::test_Client_kwargs
    `distributed.core.Status` and the cluster's worker objects
test_progressbar::test_text_progressbar
    the progress bar's `_last_response`
test_worker_client::test_secede_without_stealing_issue_1262
    runs Dask's scheduler and workers in process, without their extensions (`gen_cluster`)
test_failed_workers::test_restart_sync
    the scheduler's `who_has` handler, run with `sync(loop, ...)`
test_semaphore::test_worker_dies
    the scheduler object's semaphore extension
test_semaphore::test_threadpoolworkers_pick_correct_ioloop
    the semaphore's IOLoop and `refresh_callback`
"""

# "file stem::test name" -> the internal.
_LINES = _LEFT_OUT.strip().split("\n")
INTERNALS: dict[str, str] = {
    test: why.strip() for test, why in zip(_LINES[0::2], _LINES[1::2], strict=True)
}


@dataclass(frozen=True)
class Selected:
    path: Path  # the test file in the checkout
    tests: tuple[str, ...]  # its test functions in the selection
    left_out: tuple[tuple[str, str], ...]  # (test function, internal it reads)


def _in_process(node: ast.FunctionDef) -> bool:
    return any(
        "gen_cluster" in ast.unparse(decorator) or "gen_test" in ast.unparse(decorator)
        for decorator in node.decorator_list
    )


def select(checkout: Path) -> list[Selected]:
    """The selection in the Dask.distributed checkout at ``checkout``."""
    found = []
    for relative in FILES:
        path = checkout / relative
        if not path.is_file():
            raise SystemExit(f"{checkout} has no {relative}: is it a dask/distributed checkout?")
        tests, left_out = [], []
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            if _in_process(node):
                continue
            reason = INTERNALS.get(f"{path.stem}::{node.name}")
            if reason is None:
                tests.append(node.name)
            else:
                left_out.append((node.name, reason))
        found.append(Selected(path, tuple(tests), tuple(left_out)))
    named = {f"{chosen.path.stem}::{test}" for chosen in found for test, _ in chosen.left_out}
    if stale := sorted(set(INTERNALS) - named):
        # A checkout of another version: say so rather than quietly count differently.
        print(f"left out, but not synchronous tests in this checkout: {stale}", file=sys.stderr)
    return found
