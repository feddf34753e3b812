"""Public test tools: drive the scheduler's decisions without processes or sockets.

``SimulatedCluster`` runs the real scheduler state machine against fake workers in
simulated time, so a resource plan can be checked in milliseconds::

    from apportion.testing import SimulatedCluster

    sim = SimulatedCluster()
    sim.add_client()
    sim.add_worker("gpus", nthreads=4, resources="gpu0=1 gpu1=1")
    for name, need in [("a", "gpu0=1"), ("b", "gpu0=1"), ("c", "gpu0=1 gpu1=1")]:
        sim.submit(name, resources=need)
    intervals = sim.run({"a": 2.0, "b": 2.0, "c": 2.0})
"""

from apportion.testing.clock import FakeClock
from apportion.testing.simulation import Interval, SimulatedCluster

__all__ = ["FakeClock", "Interval", "SimulatedCluster"]
