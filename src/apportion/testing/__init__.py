"""Public test tools: the scheduler's decisions, a cluster and time, without processes.

``SimulatedCluster`` runs the real scheduler state machine against fake workers in
simulated time, so a resource plan can be checked in milliseconds::

    from apportion.testing import SimulatedCluster

    sim = SimulatedCluster()
    sim.add_client()
    sim.add_worker("gpus", nthreads=4, resources="gpu0=1 gpu1=1")
    for name, need in [("a", "gpu0=1"), ("b", "gpu0=1"), ("c", "gpu0=1 gpu1=1")]:
        sim.submit(name, resources=need)
    intervals = sim.run({"a": 2.0, "b": 2.0, "c": 2.0})

``InMemoryCluster`` runs the real scheduler, workers and clients in this process
over ``inproc://`` connections (no socket), and ``FakeClock`` lets a test decide
when time passes::

    from apportion.testing import FakeClock, InMemoryCluster

    clock = FakeClock()
    workers = [{"nthreads": 2, "resources": "GPU=2"}, {"nthreads": 2}]
    with InMemoryCluster(workers, clock=clock) as cluster:
        client = cluster.client()
        assert client.submit(sum, [1, 2], resources={"GPU": 1}).result() == 3
        cluster.run(clock.advance(60))  # a minute of heartbeats and ticks, at once

    async def test_it() -> None:  # the same cluster on the test's own event loop
        clock = FakeClock()
        async with InMemoryCluster(2, clock=clock) as cluster:
            await clock.advance(5)
            assert len(cluster.scheduler.state.workers) == 2

``FakeMemory`` is a worker's process memory as the test sets it
(``Worker(memory=MemoryConfig(measure=FakeMemory()))``), to reach its spill and
pause thresholds without allocating. ``FakeLauncher`` runs command runs without processes:
``Worker(..., long_lived=LiveRuns(FakeLauncher()))``; with the job queue as the
scheduler's companion (``InMemoryCluster(..., companions=[RunsService(journal)])``)
a whole queue runs in one process.
"""

from apportion.testing.clock import FakeClock
from apportion.testing.cluster import InMemoryCluster
from apportion.testing.launcher import FakeLauncher
from apportion.testing.memory import FakeMemory
from apportion.testing.recording import RecordingCluster, UnexpectedMessages
from apportion.testing.simulation import Interval, SimulatedCluster

__all__ = [
    "FakeClock",
    "FakeLauncher",
    "FakeMemory",
    "InMemoryCluster",
    "Interval",
    "RecordingCluster",
    "SimulatedCluster",
    "UnexpectedMessages",
]
