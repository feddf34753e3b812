"""Actors calling actors of their own worker, on a cluster of one worker of one
thread, as Dask's test_actor.py does (test_one_thread_deadlock, its ``timeout``
and ``sync_client`` forms): such a call runs at once, so nothing waits on itself.
With a blocking client and with an asynchronous one."""

import asyncio
import json

from dask.distributed import Client, LocalCluster, get_client


class Counter:
    n = 0

    def __init__(self):
        self.n = 0

    def increment(self):
        self.n += 1
        return self.n

    def fail(self):
        raise ValueError("counter refused")

    async def ainc(self):
        self.n += 1
        return self.n


class UsesCounter:
    def do_inc(self, ac):
        return ac.increment().result()

    def do_inc_timeout(self, ac):
        # Done already: the timeout cannot expire.
        return ac.increment().result(timeout=0.001)

    def do_inc_sync_client(self, ac):
        return get_client().sync(ac.increment)

    def done_at_once(self, ac):
        return ac.increment().done()

    def read_n(self, ac):
        return ac.n  # the value itself

    def failing(self, ac):
        try:
            ac.fail().result()
        except ValueError as exc:
            return str(exc)
        return None

    def run_coroutine(self, ac):
        return asyncio.run(ac.ainc())

    def down(self, me, n):
        # The actor calls itself: through its own thread, it would wait on itself.
        return 0 if n == 0 else 1 + me.down(me, n - 1).result()

    async def ado_inc(self, ac):
        return await ac.ainc()


def blocking(cluster):
    with Client(cluster) as client:
        ac = client.submit(Counter, actor=True).result()
        ac2 = client.submit(UsesCounter, actor=True).result()
        return {
            "do_inc": ac2.do_inc(ac).result(),
            "do_inc_timeout": ac2.do_inc_timeout(ac).result(),
            "do_inc_sync_client": ac2.do_inc_sync_client(ac).result(),
            "done_at_once": ac2.done_at_once(ac).result(),
            "read_n": ac2.read_n(ac).result(),
            "failing": ac2.failing(ac).result(),
            "run_coroutine": ac2.run_coroutine(ac).result(),
            "ado_inc": ac2.ado_inc(ac).result(),
            "down": ac2.down(ac2, 3).result(),
            "n": ac.n,
        }


async def asynchronous():
    async with (
        LocalCluster(n_workers=1, threads_per_worker=1, asynchronous=True) as cluster,
        Client(cluster, asynchronous=True) as client,
    ):
        ac = await client.submit(Counter, actor=True)
        ac2 = await client.submit(UsesCounter, actor=True)
        return {
            "do_inc": await ac2.do_inc(ac),
            "do_inc_timeout": await ac2.do_inc_timeout(ac),
            "read_n": await ac2.read_n(ac),
            "ado_inc": await ac2.ado_inc(ac),
            "n": await ac.n,
        }


if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster:
        out = {"blocking": blocking(cluster)}
    out["asynchronous"] = asyncio.run(asynchronous())
    print(json.dumps(out, sort_keys=True))
