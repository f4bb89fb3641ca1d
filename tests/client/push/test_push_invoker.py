"""ListenerInvoker: plain listeners in threads (bounded), async ones on the loop, failures."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from tests.client.push.test_push_process_queue import msg
from tidemq.client.push.invoker import SKIPPED, ListenerInvoker
from tidemq.client.push.types import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, succeeded

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS


async def test_plain_listeners_run_in_threads_at_most_concurrency_at_once():
    running, peak, threads = [0], [0], set()
    lock = threading.Lock()

    def blocking(msgs):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            threads.add(threading.current_thread().name)
        time.sleep(0.05)  # user code may block
        with lock:
            running[0] -= 1
        return OK

    inv = ListenerInvoker(blocking, 3, "g")
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    t = asyncio.ensure_future(ticker())
    results = await asyncio.gather(*(inv.call([msg(i)]) for i in range(9)))
    t.cancel()
    inv.shutdown()
    assert results == [OK] * 9
    assert ticks > 10  # the loop kept running while listeners blocked
    assert peak[0] == 3 and all(n.startswith("tidemq-consume-g") for n in threads)
    assert inv.calls == 9


async def test_async_listeners_and_callable_objects_run_on_the_loop():
    class Handler:
        async def __call__(self, msgs):
            await asyncio.sleep(0)
            return ConsumeOrderlyStatus.SUCCESS

    inv = ListenerInvoker(Handler(), 2, "g")
    assert inv._pool is None
    assert await inv.call([msg(1)]) is ConsumeOrderlyStatus.SUCCESS
    inv.closing = True
    assert await inv.call([msg(1)]) is SKIPPED


async def test_exceptions_and_none_mean_later(caplog):
    def boom(msgs):
        raise RuntimeError("bad")

    inv = ListenerInvoker(boom, 1, "g")
    with caplog.at_level(logging.WARNING):
        assert await inv.call([msg(1)]) is None
    assert inv.failures == 1 and "bad" in caplog.text
    caplog.clear()
    lazy = ListenerInvoker(lambda msgs: None, 1, "g")
    with caplog.at_level(logging.WARNING):
        assert await lazy.call([msg(1)]) is None
        assert await lazy.call([msg(2)]) is None
    assert caplog.text.count("returned None") == 1
    inv.shutdown()
    lazy.shutdown()
    assert succeeded(OK) and succeeded(ConsumeOrderlyStatus.SUCCESS)
    assert not succeeded(None) and not succeeded(ConsumeConcurrentlyStatus.RECONSUME_LATER)
    assert not succeeded(ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT) and not succeeded(True)
