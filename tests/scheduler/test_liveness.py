"""Heartbeats against the worker timeout, in memory on a fake clock, and the CLI option."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from apportion import Scheduler, get_worker
from apportion.cli.main import main
from apportion.protocol.worker import Heartbeat, HeartbeatInterval
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import FakeClock, InMemoryCluster, RecordingCluster


def test_heartbeats_keep_an_idle_worker_registered_past_the_timeout() -> None:
    async def main() -> None:
        clock = FakeClock()
        config = SchedulerConfig(worker_timeout=0.6)
        async with InMemoryCluster([{"heartbeat_interval": 0.1}], config=config, clock=clock) as c:
            await clock.advance(2.0)  # several timeouts pass with only heartbeats
            (worker,) = c.workers
            assert list(c.scheduler.info()["workers"]) == [worker.address]
            assert worker.sessions == 1

    asyncio.run(main())


def test_a_silent_worker_is_declared_lost_once_its_timeout_passes() -> None:
    async def main() -> None:
        clock = FakeClock()
        config = SchedulerConfig(worker_timeout=5.0)
        silent = {"name": "silent", "heartbeat_interval": 60.0, "reconnect_timeout": 0}
        async with InMemoryCluster([silent], config=config, clock=clock) as c:
            (worker,) = c.workers
            await clock.advance(4.5)
            assert c.scheduler.info()["workers"], "not yet: the timeout has not passed"
            await clock.advance(1.5)
            assert not c.scheduler.info()["workers"]
            await asyncio.wait_for(worker.finished(), 5)  # told by the closed connection

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_scheduler_cli_passes_the_worker_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SchedulerConfig] = []

    async def fake_run(
        listen: object, config: SchedulerConfig, *args: object, **kw: object
    ) -> None:
        seen.append(config)

    monkeypatch.setattr("apportion.cli.scheduler._run", fake_run)
    assert CliRunner().invoke(main, ["scheduler", "--worker-timeout", "2.5"]).exit_code == 0
    assert CliRunner().invoke(main, ["scheduler"]).exit_code == 0
    assert [c.worker_timeout for c in seen] == [2.5, 30.0]
    result = CliRunner().invoke(main, ["scheduler", "--help"])
    assert "--worker-timeout" in result.output
    assert CliRunner().invoke(main, ["scheduler", "--worker-timeout", "0"]).exit_code == 2


def _where() -> str:
    return get_worker().name


def test_workers_reconnect_to_a_restarted_scheduler_after_their_backoff() -> None:
    async def main() -> None:
        clock = FakeClock()
        workers = [{"name": name, "resources": f"{name}=1", "nthreads": 2} for name in "ab"]
        async with InMemoryCluster(workers, clock=clock) as cluster:
            await cluster.scheduler.close()  # the scheduler goes away; its address stays
            await clock.advance(0)
            assert not any(w.connected for w in cluster.workers)
            cluster.scheduler = Scheduler(cluster.address, clock=clock)
            await cluster.scheduler.start()
            await clock.advance(1.0)  # past the first backoffs
            names = sorted(w.name for w in cluster.scheduler.state.workers.values())
            assert names == ["a", "b"] and all(w.sessions == 2 for w in cluster.workers)
            client = await asyncio.to_thread(cluster.client)
            ran_on = [client.submit(_where, resources={name: 1}) for name in "ab"]
            assert await asyncio.to_thread(client.gather, ran_on) == ["a", "b"]
            await asyncio.to_thread(client.close)

    asyncio.run(main())


def test_a_scheduler_of_many_workers_stretches_their_heartbeats(
    make_sim: Callable[..., RecordingCluster],
) -> None:
    sim = make_sim(SchedulerConfig(heartbeats_per_second=2))

    def told(*workers: str) -> list[float]:
        return [m.seconds for w in workers for m in sim.worker_got(w, HeartbeatInterval)]

    a, b = sim.add_worker(), sim.add_worker()
    assert told(a, b) == []  # two workers beating every second: two beats a second
    c = sim.add_worker()
    assert told(a, b, c) == [2.0, 2.0, 2.0]  # three: every two seconds, all told
    d = sim.add_worker()
    assert told(a, b, c, d) == [2.0, 2.0, 2.0, 2.0]  # the same: only the newcomer told
    e = sim.add_worker()
    assert told(a, b, c, d, e) == [2.0, 3.0] * 3 + [2.0, 3.0] + [3.0]
    sim.remove_worker(e)
    assert told(a, b, c, d) == [2.0, 3.0, 2.0] * 3 + [2.0, 3.0, 2.0]
    sim.remove_worker(d)
    sim.remove_worker(c)
    assert told(a, b) == [2.0, 3.0, 2.0, 0.0] * 2  # back to their own intervals


def test_stretched_heartbeats_stay_well_inside_the_worker_timeout(
    make_sim: Callable[..., RecordingCluster],
) -> None:
    sim = make_sim(SchedulerConfig(heartbeats_per_second=1, worker_timeout=5.0))
    workers = [sim.add_worker() for _ in range(20)]
    assert sim.worker_got(workers[-1], HeartbeatInterval) == [HeartbeatInterval(1.0)]
    sim.allow(HeartbeatInterval)


def test_workers_beat_as_seldom_as_the_scheduler_asks_and_no_less_often() -> None:
    async def main() -> None:
        clock = FakeClock()
        config = SchedulerConfig(heartbeats_per_second=1)
        workers = [{"heartbeat_interval": 0.5}, {"heartbeat_interval": 0.5}]
        async with InMemoryCluster(workers, config=config, clock=clock) as c:
            beats = {w.name: 0 for w in c.workers}
            for w in c.workers:
                counted = _counting(w._heartbeat_message, beats, w.name)
                w._heartbeat_message = counted  # type: ignore[method-assign]
            await clock.advance(10.0)
            assert set(beats.values()) <= {5, 6}  # two workers: one beat each 2 s
            await c.remove_worker(c.workers[1])
            first = c.workers[0].name
            beats[first] = 0
            await clock.advance(10.0)
            assert beats[first] >= 19  # alone: its own interval again, from the next tick

    asyncio.run(main())


def _counting(heartbeat: Callable[[], Heartbeat], beats: dict[str, int], name: str) -> Any:
    def counted() -> Heartbeat:
        beats[name] += 1
        return heartbeat()

    return counted


def test_a_worker_forgets_the_stretch_when_its_scheduler_is_replaced() -> None:
    async def main() -> None:
        clock = FakeClock()
        config = SchedulerConfig(heartbeats_per_second=1)
        workers = [{"heartbeat_interval": 0.5}] * 3
        async with InMemoryCluster(workers, config=config, clock=clock) as c:
            assert [w._heartbeat_floor for w in c.workers] == [3.0] * 3
            await c.scheduler.close()
            c.scheduler = Scheduler(c.address, clock=clock)  # 3 workers: no stretch
            await c.scheduler.start()
            for _ in range(200):
                if all(w.sessions == 2 and w.connected for w in c.workers):
                    break
                await clock.advance(0.5)
            assert all(w.sessions == 2 for w in c.workers)
            beats = {w.name: 0 for w in c.workers}
            for w in c.workers:
                counted = _counting(w._heartbeat_message, beats, w.name)
                w._heartbeat_message = counted  # type: ignore[method-assign]
            await clock.advance(5.0)
            assert [w._heartbeat_floor for w in c.workers] == [0.0] * 3
            assert min(beats.values()) >= 9  # every 0.5 s again, not every 3 s

    asyncio.run(main())
