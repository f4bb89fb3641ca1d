"""The executor's reads (read_slice over tidemq.spark.pulling) against a real broker, without Spark.

The broker returns at most 16 KiB per pull here, so a slice of a few thousand small messages takes
dozens of pulls, each sent before the previous answer is decoded: the tests check that a slice
still reads exactly its offsets, once each and in order, however it is cut.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.procs import Cluster
from tests.spark.support import send
from tests.support.topics import create_topic_sync
from tidemq.spark import brokers, clients
from tidemq.spark.brokers import ROWS_PER_BATCH, SourceError, read_slice
from tidemq.spark.offsets import Slice
from tidemq.spark.options import SourceOptions

PULL_BYTES = 16 * 1024  # ~100 of these messages per pull
BIG = ROWS_PER_BATCH + 1500  # messages in queue 0 of the big topic: more than one Arrow batch


@pytest.fixture(autouse=True)
def close_readers():
    """Each test's reading loops are closed while its broker still runs (not at exit)."""
    yield
    clients.close_all()


@pytest.fixture(scope="module")
def small_pulls(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), extra_broker_args=["--max-pull-bytes", str(PULL_BYTES)])
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def topic(small_pulls):
    name = create_topic_sync(small_pulls, "spark-pulling", 2)
    send(small_pulls, name, 3000, queues=2)  # 1500 per queue; queue q holds m<2*o + q> at offset o
    return name


@pytest.fixture(scope="module")
def big_topic(small_pulls):
    name = create_topic_sync(small_pulls, "spark-pulling-big", 1)
    send(small_pulls, name, BIG, queues=1)
    return name


def opts(cluster: Cluster, topic: str, **kw) -> SourceOptions:
    return SourceOptions(name_servers=(cluster.namesrv_addr,), topics=(topic,), **kw)


def offsets_and_values(batches) -> list[tuple[int, bytes]]:
    out = []
    for b in batches:
        out += zip(b.column("queueOffset").to_pylist(), b.column("value").to_pylist(), strict=True)
    return out


@pytest.mark.parametrize("start,end,batch", [(0, 1500, 1024), (1, 1499, 1024), (37, 1211, 7),
                                             (500, 501, 1024), (0, 1500, 1)])
def test_a_slice_reads_exactly_its_offsets_in_order(small_pulls, topic, start, end, batch):
    got = offsets_and_values(read_slice(opts(small_pulls, topic, pull_batch_size=batch),
                                        Slice(topic, "broker-a", 1, start, end)))
    assert got == [(o, b"m%d" % (2 * o + 1)) for o in range(start, end)]


def test_a_tag_filtered_slice_reads_exactly_the_matching_offsets(small_pulls, topic):
    # queue 0 holds m0, m2, m4 ...: all "even"; queue 1 all "odd"; a filter for "odd" on queue 0
    # finds nothing (NO_MATCHED answers, each sent ahead of the last), on queue 1 everything
    o = opts(small_pulls, topic, tag_expression="odd")
    assert offsets_and_values(read_slice(o, Slice(topic, "broker-a", 0, 3, 1400))) == []
    got = offsets_and_values(read_slice(o, Slice(topic, "broker-a", 1, 3, 1400)))
    assert [off for off, _ in got] == list(range(3, 1400))


def test_the_next_pull_is_in_flight_while_spark_holds_a_batch_and_none_after_the_end(small_pulls, big_topic):
    o = opts(small_pulls, big_topic)
    reader = brokers._reader(o)
    slices = read_slice(o, Slice(big_topic, "broker-a", 0, 0, BIG))
    first = next(slices)
    assert first.num_rows >= ROWS_PER_BATCH
    assert reader.in_flight == 1  # sent before the batch was handed over
    rest = list(slices)
    assert offsets_and_values([first, *rest]) == [(o, b"m%d" % o) for o in range(BIG)]
    assert reader.in_flight == 0  # nothing is pulled past a slice's end


def test_a_read_closed_early_leaves_the_next_read_of_the_thread_exact(small_pulls, big_topic):
    o = opts(small_pulls, big_topic)
    slices = read_slice(o, Slice(big_topic, "broker-a", 0, 0, BIG))
    next(slices)
    slices.close()  # as Spark does when a query stops early (limit ...): the pull ahead is dropped
    # the dropped pull's answer arrives on the connection this read uses too
    got = offsets_and_values(read_slice(o, Slice(big_topic, "broker-a", 0, 100, BIG)))
    assert got == [(o, b"m%d" % o) for o in range(100, BIG)]
    assert brokers._reader(o).in_flight == 0


def test_an_interrupt_in_the_middle_of_a_read_is_raised_as_itself_and_the_next_read_is_exact(small_pulls, big_topic):
    """Ctrl-C while a batch is read (a KeyboardInterrupt raised inside the reading loop's step):
    the read ends with that KeyboardInterrupt (closing the half-run generator raised a
    RuntimeError over it), and the thread's next read gets a fresh reader."""
    o = opts(small_pulls, big_topic)
    reader = brokers._reader(o)
    slices = read_slice(o, Slice(big_topic, "broker-a", 0, 0, BIG))

    def interrupt() -> None:
        raise KeyboardInterrupt

    reader.loop.call_later(0.005, interrupt)  # the first batch takes dozens of pulls
    with pytest.raises(KeyboardInterrupt):
        next(slices)
    assert brokers._reader(o) is not reader
    got = offsets_and_values(read_slice(o, Slice(big_topic, "broker-a", 0, 100, 300)))
    assert got == [(o, b"m%d" % o) for o in range(100, 300)]


def test_threads_read_on_loops_of_their_own(small_pulls, topic):
    o = opts(small_pulls, topic, pull_batch_size=50)
    results: dict[int, object] = {}

    def work(q: int) -> None:
        try:
            results[q] = (brokers._reader(o), offsets_and_values(
                read_slice(o, Slice(topic, "broker-a", q, 0, 1500))))
        except Exception as exc:  # noqa: BLE001 (reported below)
            results[q] = exc

    threads = [threading.Thread(target=work, args=(q,)) for q in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    (loop0, rows0), (loop1, rows1) = results[0], results[1]
    assert loop0 is not loop1
    assert rows0 == [(o, b"m%d" % (2 * o)) for o in range(1500)]
    assert rows1 == [(o, b"m%d" % (2 * o + 1)) for o in range(1500)]


def test_a_slice_past_the_queues_end_names_the_end_and_the_reader_goes_on(small_pulls, topic):
    o = opts(small_pulls, topic)
    with pytest.raises(SourceError, match="the queue now ends at 1500, before offset 1500"):
        list(read_slice(o, Slice(topic, "broker-a", 0, 1400, 1600)))
    got = offsets_and_values(read_slice(o, Slice(topic, "broker-a", 0, 1490, 1500)))
    assert got == [(o, b"m%d" % (2 * o)) for o in range(1490, 1500)]


def test_a_connection_the_broker_closed_while_the_loop_was_idle_is_opened_again(cluster_factory):
    # Between two reads nothing runs the reading thread's loop while the broker closes the idle
    # connection; the next read's first loop turn must see the close before writing its pull.
    c = cluster_factory(extra_broker_args=["--idle-timeout", "0.5"])
    name = create_topic_sync(c, "spark-pulling-idle", 1)
    send(c, name, 300, queues=1)
    o = opts(c, name)
    assert len(offsets_and_values(read_slice(o, Slice(name, "broker-a", 0, 0, 100)))) == 100
    time.sleep(1.5)  # > idle timeout + its check period (timeout / 4)
    got = offsets_and_values(read_slice(o, Slice(name, "broker-a", 0, 100, 300)))
    assert got == [(o, b"m%d" % o) for o in range(100, 300)]
