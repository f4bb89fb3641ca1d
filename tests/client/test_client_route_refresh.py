"""Fault-driven route refreshes (issue 17): the bound of FaultRefresher against a fake route
source and an injected clock (no sleeping), a Sender following a broker group's failover to the
new master within one send's retry budget, and a puller moving to it without its back-off."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.client.test_client_sender import ADDRS, FakeClock, FakeInstance, make, out, route
from tidemq.client.config import ClientConfig
from tidemq.client.fault import FaultStrategy
from tidemq.client.heartbeat import Subscription
from tidemq.client.instance import ClientInstance
from tidemq.client.push.process_queue import ProcessQueue
from tidemq.client.push.puller import PullSettings, QueuePuller
from tidemq.client.route import BrokerData, MessageQueue, Perm, QueueData, TopicRouteData
from tidemq.client.route_cache import RouteCache
from tidemq.client.route_refresh import BURST as REFRESH_BURST, FaultRefresher
from tidemq.client.send import SendStatus, prepare_message
from tidemq.client.sender import Sender
from tidemq.errors import BrokerError, ClientError, ConnectError, RemotingTimeoutError
from tidemq.message import Message, Prop
from tidemq.remoting import RemotingCommand, ResponseCode

NEW_MASTER = "10.0.0.9:10911"


class FakeRouteSource:
    """Counts fetches; each waits for ``gate`` (set by default) and may raise ``fail``."""

    def __init__(self) -> None:
        self.fetches: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def __call__(self, topic: str) -> None:
        self.fetches.append(topic)
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail


async def test_concurrent_faults_share_one_refresh_in_flight():
    source, clock = FakeRouteSource(), FakeClock()
    source.gate.clear()
    refresher = FaultRefresher(source, min_interval=0.5, clock=clock)
    first = refresher.request("T")
    assert first is not None
    assert all(refresher.request("T") is first for _ in range(100))
    source.gate.set()
    await first
    assert source.fetches == ["T"]


async def test_no_new_refresh_within_the_minimum_interval_then_one_after_it():
    source, clock = FakeRouteSource(), FakeClock()
    refresher = FaultRefresher(source, min_interval=0.5, clock=clock)
    assert await refresher.refresh("T", 1.0)
    clock.t += 0.499
    assert refresher.request("T") is None and not await refresher.refresh("T", 1.0)
    clock.t += 0.001
    assert await refresher.refresh("T", 1.0)
    assert source.fetches == ["T", "T"] and refresher.refreshes == 2


async def test_the_bound_is_per_topic():
    source, clock = FakeRouteSource(), FakeClock()
    refresher = FaultRefresher(source, min_interval=0.5, clock=clock)
    assert await refresher.refresh("A", 1.0) and await refresher.refresh("B", 1.0)
    assert refresher.request("A") is None and refresher.request("B") is None
    assert source.fetches == ["A", "B"]


async def test_a_failed_refresh_is_logged_not_raised_and_counts_against_the_bound(caplog):
    source, clock = FakeRouteSource(), FakeClock()
    source.fail = ConnectError("no name server answered")
    refresher = FaultRefresher(source, min_interval=0.5, clock=clock)
    assert await refresher.refresh("T", 1.0)
    assert "route refresh of topic T after a failed request failed" in caplog.text
    assert refresher.request("T") is None  # a dead name server is not asked again at once


async def test_a_waiter_that_gives_up_leaves_the_refresh_running_for_others():
    source, clock = FakeRouteSource(), FakeClock()
    source.gate.clear()
    refresher = FaultRefresher(source, min_interval=0.5, clock=clock)
    assert not await refresher.refresh("T", 0.01)
    task = refresher.request("T")
    assert task is not None and not task.done()
    source.gate.set()
    await task
    assert source.fetches == ["T"]


async def test_remembered_topics_are_bounded():
    source, clock = FakeRouteSource(), FakeClock()
    refresher = FaultRefresher(source, min_interval=0.5, clock=clock, max_topics=3)
    for topic in "ABCD":
        assert await refresher.refresh(topic, 1.0)
    assert len(refresher._started) == 3
    assert refresher.request("A") is not None  # forgotten first: allowed one early refresh


# The Sender over a fake instance whose route source moves broker-a's master -------------------

def failover_instance(inst: FakeInstance, clock: FakeClock) -> FaultRefresher:
    """Give ``inst`` a real FaultRefresher whose fetch reads ``inst.known`` (the name servers)."""
    async def fetch(topic: str) -> None:
        await inst.get_route(topic, refresh=True)

    refresher = FaultRefresher(fetch, min_interval=0.5, clock=clock)
    inst.refresh_route_after_fault = refresher.request  # type: ignore[method-assign,assignment]
    return refresher


def moved(broker: str = "broker-a") -> TopicRouteData:
    return TopicRouteData((QueueData(broker, 2, 2, Perm.READ | Perm.WRITE),), (BrokerData("C", broker, {0: NEW_MASTER}),))


@pytest.mark.parametrize("failure", ["refused", "timeout", "not master"])
async def test_a_send_follows_the_new_master_of_its_group_within_one_send(failure):
    old = ADDRS["broker-a"]

    def answer(addr, cmd):
        if addr != old:
            return ResponseCode.SUCCESS
        if failure == "refused":
            raise ConnectError(f"connect to {addr} refused")
        if failure == "timeout":
            raise RemotingTimeoutError(f"request to {addr} timed out")
        return ResponseCode.SERVICE_NOT_AVAILABLE

    inst, sender = make({"T": route("broker-a")}, answer, retries=2)
    clock = FakeClock()
    refresher = failover_instance(inst, clock)
    await sender.queues("T")
    inst.known["T"] = moved()  # the new master registered as brokerId 0 at another address
    res = await sender.send_one(out(), 3.0)
    assert res.status is SendStatus.SEND_OK and res.message_queue.broker_name == "broker-a"
    assert [a for a, _ in inst.sent] == [old, NEW_MASTER]
    assert refresher.refreshes == 1
    assert sender.fault.tolerance.is_available("broker-a")  # the old master's fault is forgotten


async def test_a_failure_storm_asks_the_name_servers_once_per_interval():
    inst, sender = make({"T": route("broker-a")},
                        lambda addr, cmd: (_ for _ in ()).throw(ConnectError(f"{addr} refused")),
                        retries=2)
    clock = FakeClock()
    refresher = failover_instance(inst, clock)
    await sender.queues("T")
    results = await asyncio.gather(*(sender.send_one(out(), 3.0) for _ in range(50)),
                                   return_exceptions=True)
    assert all(isinstance(r, ConnectError) for r in results)
    assert refresher.refreshes == 1 and len(inst.sent) == 150
    clock.t += 0.5
    with pytest.raises(ConnectError):
        await sender.send_one(out(), 3.0)
    assert refresher.refreshes == 2


async def test_with_another_broker_the_retry_goes_there_without_waiting_for_the_refresh():
    inst, sender = make({"T": route("broker-a", "broker-b")},
                        lambda addr, cmd: (ResponseCode.SUCCESS if addr == ADDRS["broker-b"]
                                           else ResponseCode.SERVICE_NOT_AVAILABLE))
    clock = FakeClock()
    failover_instance(inst, clock)
    gate = asyncio.Event()  # a name server that does not answer

    async def hanging(topic: str) -> None:
        await gate.wait()

    refresher = FaultRefresher(hanging, min_interval=0.5, clock=clock)
    inst.refresh_route_after_fault = refresher.request
    await sender.queues("T")
    for _ in range(3):
        res = await asyncio.wait_for(sender.send_one(out(), 3.0), 1.0)
        assert res.message_queue.broker_name == "broker-b"
    pending = refresher.request("T")
    gate.set()
    if pending is not None:
        await pending


async def test_not_replicated_answers_are_sent_again_and_the_last_returned_when_none_does_better():
    answers = iter([ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.SUCCESS])
    inst, sender = make({"T": route("broker-a")}, lambda addr, cmd: next(answers), retries=2)
    res = await sender.send_one(out(), 3.0)
    assert res.status is SendStatus.SEND_OK and len(inst.sent) == 2 and inst.refreshed == ["T"]

    inst, sender = make({"T": route("broker-a")},
                        lambda addr, cmd: ResponseCode.FLUSH_SLAVE_TIMEOUT, retries=2)
    res = await sender.send_one(out(), 3.0)
    assert res.status is SendStatus.FLUSH_SLAVE_TIMEOUT and len(inst.sent) == 3


async def test_a_half_message_is_not_sent_again_after_a_not_replicated_answer():
    """The stored half is in the broker's transaction check already: a second half would be
    committed (or checked) and delivered too."""
    inst, sender = make({"T": route("broker-a")}, lambda addr, cmd: ResponseCode.SLAVE_NOT_AVAILABLE, retries=2)
    half = prepare_message(Message("T", b"x", properties={Prop.TRAN_MSG: "true"}), "UNIQ1", None)
    res = await sender.send_one(half, 3.0)
    assert res.status is SendStatus.SLAVE_NOT_AVAILABLE and len(inst.sent) == 1


async def test_a_not_replicated_answer_to_a_fixed_queue_send_is_returned_not_sent_again():
    """Stored already: a second copy would land behind later messages of the ordered queue."""
    inst, sender = make({"T": route("broker-a")}, lambda addr, cmd: ResponseCode.SLAVE_NOT_AVAILABLE)
    await sender.queues("T")
    mq = inst.routes.publish_queues("T")[0]
    res = await sender.send("T", sender.single(out()), "UNIQ1", mq, 3.0)
    assert res.status is SendStatus.SLAVE_NOT_AVAILABLE and len(inst.sent) == 1
    assert inst.refreshed == ["T"]


# Fixed-queue sends (ordered, selector, explicit queue) across a failover ----------------------

def fixed_sender(answer, interval: float = 0.5, retries: int = 2):
    """A Sender over a FakeInstance whose fault-driven refreshes are bounded by a real clock."""
    inst, _ = make({"T": route("broker-a", "broker-b")}, answer, retries=retries)
    config = ClientConfig(retry_times_when_send_failed=retries, request_timeout=3.0,
                          fault_route_refresh_interval=interval)
    sender = Sender(inst, "pg", config, FaultStrategy(True, FakeClock(), seed=3))  # type: ignore[arg-type]

    async def fetch(topic: str) -> None:
        await inst.get_route(topic, refresh=True)

    refresher = FaultRefresher(fetch, min_interval=interval)
    inst.refresh_route_after_fault = refresher.request  # type: ignore[method-assign,assignment]
    return inst, sender, refresher


@pytest.mark.parametrize("failure", ["refused", "timeout", "not master", "no permission"])
async def test_a_fixed_queue_send_is_retried_on_the_same_queue_of_its_groups_new_master(failure):
    old = ADDRS["broker-a"]

    def answer(addr, cmd):
        if addr != old:
            return ResponseCode.SUCCESS
        if failure == "refused":
            raise ConnectError(f"connect to {addr} refused")
        if failure == "timeout":
            raise RemotingTimeoutError(f"request to {addr} timed out")
        return ResponseCode.SERVICE_NOT_AVAILABLE if failure == "not master" else ResponseCode.NO_PERMISSION

    inst, sender, refresher = fixed_sender(answer)
    await sender.queues("T")
    mq = MessageQueue("T", "broker-a", 1)
    inst.known["T"] = TopicRouteData(
        (QueueData("broker-a", 2, 2, Perm.READ | Perm.WRITE), QueueData("broker-b", 2, 2, Perm.READ | Perm.WRITE)),
        (BrokerData("C", "broker-a", {0: NEW_MASTER}), BrokerData("C", "broker-b", {0: ADDRS["broker-b"]})))
    res = await sender.send("T", sender.single(out()), "UNIQ1", mq, 3.0)
    assert res.status is SendStatus.SEND_OK and res.message_queue == mq
    # never another broker (the order the caller asked for), the same queue id on the new master
    assert [(a, c.ext_fields["e"]) for a, c in inst.sent] == [(old, "1"), (NEW_MASTER, "1")]
    assert refresher.refreshes == 1


async def test_a_fixed_queue_send_retries_an_unmoved_master_only_after_the_refresh_interval():
    """A broker restarted in place keeps its address: the retry goes there again, but no sooner
    than one refresh interval after the fault, and within the retry budget."""
    loop = asyncio.get_running_loop()
    times: list[float] = []

    def answer(addr, cmd):
        times.append(loop.time())
        raise ConnectError(f"connect to {addr} refused")

    inst, sender, refresher = fixed_sender(answer, interval=0.1, retries=2)
    await sender.queues("T")
    mq = MessageQueue("T", "broker-a", 0)
    with pytest.raises(ConnectError, match="failed after 3 attempt"):
        await sender.send("T", sender.single(out()), "UNIQ1", mq, 3.0)
    assert [a for a, _ in inst.sent] == [ADDRS["broker-a"]] * 3
    assert all(b - a >= 0.1 for a, b in zip(times, times[1:])), times
    assert refresher.refreshes == 3  # one per fault, each one interval after the last


async def test_a_fixed_queue_send_gives_up_at_its_timeout_while_waiting_for_a_new_master():
    inst, sender, _ = fixed_sender(lambda addr, cmd: ResponseCode.SERVICE_NOT_AVAILABLE, interval=5.0)
    await sender.queues("T")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(BrokerError) as err:
        await sender.send("T", sender.single(out()), "UNIQ1", MessageQueue("T", "broker-a", 0), 0.3)
    assert err.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert 0.25 <= loop.time() - started < 1.0 and len(inst.sent) == 1


async def test_a_fixed_queue_send_refused_for_another_reason_is_not_retried():
    inst, sender, refresher = fixed_sender(lambda addr, cmd: ResponseCode.SYSTEM_ERROR)
    await sender.queues("T")
    with pytest.raises(BrokerError, match="failed after 1 attempt"):
        await sender.send("T", sender.single(out()), "UNIQ1", MessageQueue("T", "broker-a", 0), 3.0)
    assert len(inst.sent) == 1 and refresher.refreshes == 0


# The push / lite-pull puller -------------------------------------------------------------------

class FakePullInstance:
    """What a QueuePuller uses of a ClientInstance; pulls to ``dead`` are refused."""

    def __init__(self, refresher_clock: FakeClock, dead: str) -> None:
        self.config = ClientConfig(request_timeout=1.0)
        self.routes = RouteCache()
        self.known = route("broker-a")
        self.routes.update("T", self.known)
        self.dead = dead
        self.pulled_from: list[str] = []

        async def fetch(topic: str) -> None:
            self.routes.update(topic, self.known)

        self.refresher = FaultRefresher(fetch, min_interval=0.5, clock=refresher_clock)
        self.refresh_route_after_fault = self.refresher.request

    async def queue_read_addr(self, mq: MessageQueue) -> str:
        addr = self.routes.read_addr(mq.broker_name)
        assert addr is not None
        return addr

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        self.pulled_from.append(addr)
        if addr == self.dead:
            raise ConnectError(f"connect to {addr} refused")
        return cmd.response(ResponseCode.PULL_NOT_FOUND, "",
                            {"nextBeginOffset": 0, "minOffset": 0, "maxOffset": 0})


class FakePullHost:
    group = "cg"

    def __init__(self, inst: FakePullInstance, pq: ProcessQueue) -> None:
        self.instance = inst
        self.pq = pq
        self.offset_store = self

    async def read(self, mq: MessageQueue, how: object) -> int:
        return 0

    def subscription(self, topic: str) -> Subscription:
        return Subscription(topic)

    async def pull_gate(self, puller: QueuePuller) -> float:
        return 0.0

    def deliver(self, puller: QueuePuller, msgs: list) -> None:
        raise AssertionError("nothing to deliver")

    def on_caught_up(self, puller: QueuePuller, next_offset: int) -> None:
        self.pq.dropped = True  # one successful pull is all this test needs


async def test_a_puller_moves_to_the_new_master_at_once_instead_of_backing_off():
    inst = FakePullInstance(FakeClock(), dead=ADDRS["broker-a"])
    inst.known = moved()  # the replacement registered while the puller held the old route
    pq = ProcessQueue()
    host = FakePullHost(inst, pq)
    puller = QueuePuller(host, MessageQueue("T", "broker-a", 0), pq, 0,
                         PullSettings(error_backoff=60.0))
    await asyncio.wait_for(puller.run(), 5.0)  # a 60 s back-off would time this out
    assert inst.pulled_from == [ADDRS["broker-a"], NEW_MASTER]
    assert inst.refresher.refreshes == 1


async def test_a_puller_whose_group_lost_its_master_pulls_from_its_follower_at_once():
    inst = FakePullInstance(FakeClock(), dead=ADDRS["broker-a"])
    follower = "10.0.0.7:10911"
    inst.known = TopicRouteData((QueueData("broker-a", 2, 2, Perm.READ | Perm.WRITE),),
                                (BrokerData("C", "broker-a", {3: "10.0.0.8:10911", 2: follower}),))
    pq = ProcessQueue()
    puller = QueuePuller(FakePullHost(inst, pq), MessageQueue("T", "broker-a", 0), pq, 0,
                         PullSettings(error_backoff=60.0))
    await asyncio.wait_for(puller.run(), 5.0)
    assert inst.pulled_from == [ADDRS["broker-a"], follower]  # the lowest brokerId


async def test_a_puller_keeps_looking_at_the_route_during_its_back_off():
    """The name servers drop a killed master only once they see its connection close: the
    first refresh may still name it; a later one (within the back-off) finds the new master."""
    inst = FakePullInstance(time.monotonic, dead=ADDRS["broker-a"])
    pq = ProcessQueue()
    puller = QueuePuller(FakePullHost(inst, pq), MessageQueue("T", "broker-a", 0), pq, 0,
                         PullSettings(error_backoff=60.0))

    async def registered_late() -> None:
        await asyncio.sleep(0.1)
        inst.known = moved()

    late = asyncio.create_task(registered_late())
    await asyncio.wait_for(puller.run(), 5.0)  # not the 60 s back-off
    await late
    assert inst.pulled_from == [ADDRS["broker-a"], NEW_MASTER]
    assert inst.refresher.refreshes == 2


async def test_a_puller_whose_group_did_not_move_backs_off_as_before():
    inst = FakePullInstance(FakeClock(), dead=ADDRS["broker-a"])
    pq = ProcessQueue()
    puller = QueuePuller(FakePullHost(inst, pq), MessageQueue("T", "broker-a", 0), pq, 0,
                         PullSettings(error_backoff=60.0))
    task = asyncio.create_task(puller.run())
    await asyncio.sleep(0.05)
    assert inst.pulled_from == [ADDRS["broker-a"]] and not task.done()  # waiting out its back-off
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ClientInstance: addresses looked up through the bounded refresh -------------------------------

class CountingRoutes:
    """A route source for a real ClientInstance (its ``fetch_route``): counts the lookups."""

    def __init__(self, route_data: TopicRouteData) -> None:
        self.route = route_data
        self.lookups = 0

    async def __call__(self, topic: str) -> TopicRouteData:
        self.lookups += 1
        await asyncio.sleep(0.01)  # a name server round trip: concurrent callers overlap
        return self.route


def group_route(addrs: dict[int, str]) -> TopicRouteData:
    return TopicRouteData((QueueData("broker-a", 2, 2, Perm.READ | Perm.WRITE),),
                          (BrokerData("C", "broker-a", addrs),))


@pytest.fixture
async def instance():
    inst = ClientInstance(ClientConfig(name_servers=("127.0.0.1:1",), request_timeout=1.0,
                                       fault_route_refresh_interval=0.2))
    await inst.start()
    yield inst
    await inst.close()


async def test_master_addr_of_a_group_without_master_asks_the_name_servers_within_the_bound(instance):
    """A burst of REFRESH_BURST lookups (a failover's first moments), then one per interval."""
    assert instance.fault_refresher.burst == REFRESH_BURST
    source = CountingRoutes(group_route({2: "10.0.0.3:10911"}))  # only a follower registered
    instance.fetch_route = source  # type: ignore[method-assign]
    await instance.get_route("T")
    assert source.lookups == 1
    results = await asyncio.gather(*(instance.master_addr("T", "broker-a") for _ in range(50)),
                                   return_exceptions=True)
    assert all(isinstance(r, ClientError) and "no master address" in str(r) for r in results)
    assert source.lookups == 2  # one bounded refresh shared by all fifty
    for _ in range(10):
        with pytest.raises(ClientError):
            await instance.master_addr("T", "broker-a")
    burst = source.lookups - 1
    # the burst's credits, and at most one more for the time these calls took (~0.1 of a 0.2 s interval)
    assert REFRESH_BURST <= burst <= REFRESH_BURST + 1, burst
    await asyncio.sleep(0.2)
    source.route = group_route({0: NEW_MASTER, 2: "10.0.0.3:10911"})
    assert await instance.master_addr("T", "broker-a") == NEW_MASTER
    assert source.lookups == burst + 2


async def test_a_burst_of_refreshes_then_one_per_interval():
    source, clock = FakeRouteSource(), FakeClock()
    refresher = FaultRefresher(source, min_interval=0.5, clock=clock, burst=3)
    for _ in range(3):
        assert await refresher.refresh("T", 1.0)
    assert refresher.request("T") is None
    clock.t += 0.25  # half a credit
    assert refresher.request("T") is None
    clock.t += 0.25
    assert await refresher.refresh("T", 1.0) and refresher.request("T") is None
    clock.t += 10  # credit refills up to the burst, no further
    for _ in range(3):
        assert await refresher.refresh("T", 1.0)
    assert refresher.request("T") is None
    assert source.fetches == ["T"] * 7 and refresher.refreshes == 7


async def test_reads_go_to_the_lowest_follower_without_a_master_and_back_when_one_registers(instance):
    source = CountingRoutes(group_route({0: ADDRS["broker-a"], 2: "10.0.0.3:10911", 1: "10.0.0.2:10911"}))
    instance.fetch_route = source  # type: ignore[method-assign]
    mq = MessageQueue("T", "broker-a", 0)
    assert await instance.queue_read_addr(mq) == ADDRS["broker-a"]
    source.route = group_route({2: "10.0.0.3:10911", 1: "10.0.0.2:10911"})  # the master died
    await instance.get_route("T", refresh=True)
    lookups = source.lookups
    assert await instance.queue_read_addr(mq) == "10.0.0.2:10911"
    with pytest.raises(ClientError, match="no master address"):
        await instance.queue_master_addr(mq)  # commits wait for a master
    # Reading from a follower asks for a (bounded) refresh, so a new master is found soon.
    source.route = group_route({0: NEW_MASTER, 2: "10.0.0.3:10911", 1: "10.0.0.2:10911"})
    await asyncio.sleep(0.25)
    assert await instance.queue_read_addr(mq) == "10.0.0.2:10911"  # starts the refresh
    await asyncio.sleep(0.05)
    assert await instance.queue_read_addr(mq) == NEW_MASTER
    assert source.lookups - lookups <= 3


def test_a_group_without_master_keeps_its_queues_for_selectors_but_not_for_publishing():
    r = TopicRouteData((QueueData("broker-a", 2, 2, Perm.READ | Perm.WRITE), QueueData("broker-b", 2, 2, Perm.READ | Perm.WRITE)),
                       (BrokerData("C", "broker-a", {2: "10.0.0.3:10911"}), BrokerData("C", "broker-b", {0: ADDRS["broker-b"]})))
    assert [(q.broker_name, q.queue_id) for q in r.publish_queues("T")] == [("broker-b", 0), ("broker-b", 1)]
    assert [(q.broker_name, q.queue_id) for q in r.ordered_queues("T")] == [
        ("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]


async def test_an_ordered_send_keeps_its_queue_while_its_group_elects_a_new_master():
    """The selector sees the masterless group's queues, so the key's queue does not move to
    another group; the send waits (bounded refreshes) for the group's new master."""
    masterless = TopicRouteData(
        (QueueData("broker-a", 2, 2, Perm.READ | Perm.WRITE), QueueData("broker-b", 2, 2, Perm.READ | Perm.WRITE)),
        (BrokerData("C", "broker-a", {2: "10.0.0.3:10911"}), BrokerData("C", "broker-b", {0: ADDRS["broker-b"]})))
    inst, sender, refresher = fixed_sender(lambda addr, cmd: ResponseCode.SUCCESS, interval=0.05)
    inst.known["T"] = masterless
    await inst.get_route("T", refresh=True)
    msg = Message("T", b"x")
    mq = await sender.fixed_queue(msg, None, lambda queues, m, arg: queues[1], None)
    assert mq == MessageQueue("T", "broker-a", 1)

    async def elect() -> None:
        await asyncio.sleep(0.12)
        inst.known["T"] = moved_with_b()

    election = asyncio.create_task(elect())
    res = await sender.send("T", sender.single(out()), "UNIQ1", mq, 3.0)
    await election
    assert res.message_queue == mq and [(a, c.ext_fields["e"]) for a, c in inst.sent] == [(NEW_MASTER, "1")]


def moved_with_b() -> TopicRouteData:
    return TopicRouteData(
        (QueueData("broker-a", 2, 2, Perm.READ | Perm.WRITE), QueueData("broker-b", 2, 2, Perm.READ | Perm.WRITE)),
        (BrokerData("C", "broker-a", {0: NEW_MASTER}), BrokerData("C", "broker-b", {0: ADDRS["broker-b"]})))


async def test_a_fixed_queue_send_waits_for_a_master_up_to_its_timeout_not_its_retry_budget():
    inst, sender, _ = fixed_sender(lambda addr, cmd: ResponseCode.SUCCESS, interval=0.05)
    inst.known["T"] = TopicRouteData((QueueData("broker-a", 2, 2, Perm.READ | Perm.WRITE),),
                                     (BrokerData("C", "broker-a", {2: "10.0.0.3:10911"}),))
    await inst.get_route("T", refresh=True)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ClientError, match="no master address"):
        await sender.send("T", sender.single(out()), "UNIQ1", MessageQueue("T", "broker-a", 0), 0.4)
    assert 0.35 <= loop.time() - started < 1.0 and not inst.sent


def single_group_sender(answer, interval: float = 0.05):
    """A Sender over a FakeInstance whose topic only broker-a serves; refreshes bounded by a real clock."""
    inst, _ = make({"T": route("broker-a")}, answer, retries=2)
    config = ClientConfig(retry_times_when_send_failed=2, request_timeout=3.0,
                          fault_route_refresh_interval=interval)
    sender = Sender(inst, "pg", config, FaultStrategy(True, FakeClock(), seed=3))  # type: ignore[arg-type]

    async def fetch(topic: str) -> None:
        await inst.get_route(topic, refresh=True)

    inst.refresh_route_after_fault = FaultRefresher(fetch, min_interval=interval).request  # type: ignore[method-assign,assignment]
    return inst, sender


MASTERLESS = TopicRouteData((QueueData("broker-a", 2, 2, Perm.READ | Perm.WRITE),),
                            (BrokerData("C", "broker-a", {2: "10.0.0.3:10911"}),))


async def _elect_after(inst: FakeInstance, seconds: float) -> None:
    await asyncio.sleep(seconds)
    inst.known["T"] = moved()


async def test_a_send_waits_through_its_only_groups_election_instead_of_failing():
    """The master dies (refused), the route names no master for a while (an election: more
    attempts than the retry budget would allow find none), then the new master: one SEND_OK."""
    old = ADDRS["broker-a"]

    def answer(addr, cmd):
        if addr == old:
            raise ConnectError(f"connect to {addr} refused")
        return ResponseCode.SUCCESS

    inst, sender = single_group_sender(answer)
    await sender.queues("T")
    inst.known["T"] = MASTERLESS  # the name server dropped the dead master
    election = asyncio.create_task(_elect_after(inst, 0.4))
    res = await sender.send_one(out(), 3.0)
    await election
    assert res.status is SendStatus.SEND_OK and [a for a, _ in inst.sent] == [old, NEW_MASTER]


async def test_a_send_whose_cached_route_has_no_master_waits_for_one():
    inst, sender = single_group_sender(lambda addr, cmd: ResponseCode.SUCCESS)
    inst.known["T"] = MASTERLESS
    await inst.get_route("T", refresh=True)
    election = asyncio.create_task(_elect_after(inst, 0.3))
    res = await sender.send_one(out(), 3.0)
    await election
    assert res.status is SendStatus.SEND_OK and [a for a, _ in inst.sent] == [NEW_MASTER]


async def test_a_send_waiting_for_a_master_gives_up_at_its_timeout_and_a_read_only_topic_fails_at_once():
    inst, sender = single_group_sender(lambda addr, cmd: ResponseCode.SUCCESS)
    inst.known["T"] = MASTERLESS
    await inst.get_route("T", refresh=True)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ClientError, match="no writable queue"):
        await sender.send_one(out(), 0.4)
    assert 0.35 <= loop.time() - started < 1.0 and not inst.sent
    inst.known["T"] = TopicRouteData((QueueData("broker-a", 2, 2, Perm.READ),),
                                     (BrokerData("C", "broker-a", {0: ADDRS["broker-a"]}),))
    await inst.get_route("T", refresh=True)
    started = loop.time()
    with pytest.raises(ClientError, match="no writable queue"):
        await sender.send_one(out(), 3.0)
    assert loop.time() - started < 0.2 and not inst.sent
