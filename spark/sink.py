"""The ``tidemq`` sink: ``df.write.format("tidemq")`` and ``df.writeStream.format("tidemq")``.

Columns, shaped like Spark's Kafka sink (names match case-insensitively; any other column is
refused so that a typo such as ``vaule`` fails at once instead of being dropped):

* ``value`` (string or binary, required): the message body. A null or empty value fails the task
  (RocketMQ has no empty or null body).
* ``key`` (string or binary, UTF-8): the ``KEYS`` property (RocketMQ splits it on spaces).
* ``tags`` (string): the message tag.
* ``topic`` (string): the destination, required unless the ``topic`` option is set; the option
  wins over the column, as in Kafka.
* ``properties`` (map<string,string>): user properties. Names reserved by RocketMQ (``KEYS``,
  ``DELAY``, ``UNIQ_KEY`` ...; :data:`RESERVED_PROPERTIES`), the wire separators ``\\x01``/``\\x02``
  and null or empty values are refused.
* ``queueId`` (int, optional): send to the topic's ``queueId``-th publish queue (brokers in name
  order, then queue id: on a one-broker topic, the queue with that id); null or no column lets the
  producer pick (round-robin per batch, avoiding failing brokers).

Batch writes need ``.mode("append")``: Spark refuses its default mode (ErrorIfExists) for Python
data sources, and overwrite is refused here (a topic is append-only).

The schema is checked on the driver when the query starts (a :class:`SparkOptionError`); the
rows are checked on the executors before they are sent (a :class:`SinkError` naming the row).

Delivery is **at-least-once**, as with Spark's Kafka sink. Each task sends its rows in batches of
``sendBatchSize`` messages per (topic, queue) (split further to the 4 MiB request limit) and
waits for the broker's answer; a failed send fails the task and Spark retries the whole task, so the
messages the failed attempt had already sent are sent again. Messages that reached a topic are
never taken back (``abort`` only logs), and a micro-batch re-run after a driver crash (its offsets
are in the checkpoint but its commit is not) sends its rows again. Readers that need each row once
must deduplicate downstream, e.g. by ``key``.

Executors keep one producer (and, for ``queueId``, one admin client for routes) per configuration
for the life of the Python worker (:mod:`tidemq.spark.clients`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructType

from tidemq.client.batching import split_batches
from tidemq.client.config import MAX_MESSAGE_SIZE
from tidemq.client.route import MessageQueue
from tidemq.client.validation import check_body, check_properties, check_send_topic
from tidemq.errors import ClientError, RemotingError, TideMQError
from tidemq.message import Message, Prop
from tidemq.spark.clients import cached, client_config, drop
from tidemq.spark.options import SinkOptions, SparkOptionError

try:  # PySpark 4.1+: streaming writes receive Arrow batches
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
    STREAM_ARROW = True
except ImportError:  # PySpark 4.0: rows only
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc, assignment]
    STREAM_ARROW = False

log = logging.getLogger(__name__)

# Accepted columns: canonical name -> (accepted Spark types, how the error names them).
COLUMNS: dict[str, tuple[tuple[type, ...], str]] = {
    "value": ((StringType, BinaryType), "string or binary"),
    "key": ((StringType, BinaryType), "string or binary"),
    "tags": ((StringType,), "string"),
    "topic": ((StringType,), "string"),
    "properties": ((MapType,), "map<string,string>"),
    "queueId": ((IntegerType,), "int"),
}

# Property names RocketMQ uses itself (MessageConst; PROTOCOL-REFERENCE 4.4): a user property with
# one of these names would change how brokers and clients treat the message (DELAY schedules it,
# TRAN_MSG makes it a half message ...), so the sink refuses them as Java's putUserProperty does.
RESERVED_PROPERTIES = frozenset(
    {v for k, v in vars(Prop).items() if k.isupper() and isinstance(v, str)} | {
        "BUYER_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME",
        "MSG_REGION", "TRACE_ON", "CONSUME_START_TIME", "TRAN_PREPARED_QUEUE_OFFSET",
        "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "INSTANCE_ID",
        "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET", "__SHARDINGKEY", "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "__STARTDELIVERTIME",
    })

ROWS_PER_CHUNK = 4096  # rows gathered into columns at a time on the row (PySpark 4.0) path


class SinkError(ClientError):
    """A row cannot become a message, or a send failed: the task fails (Spark retries it)."""


@dataclass(frozen=True, slots=True)
class SinkCommitMessage(WriterCommitMessage):
    """What one task sent: message and body-byte counts, and messages per topic."""

    messages: int = 0
    bytes: int = 0
    topics: dict[str, int] = field(default_factory=dict)
    partition: int | None = None


# driver side ------------------------------------------------------------------------------------


def check_sink_schema(schema: StructType, opts: SinkOptions, overwrite: bool) -> dict[str, str]:
    """Check the DataFrame's schema on the driver; return canonical name -> column name."""
    if overwrite:
        raise SparkOptionError(
            "the tidemq sink only appends: a topic cannot be overwritten or truncated; write with "
            "mode('append') (batch) or outputMode('append') (streaming)")
    accepted = ", ".join(f"{n} ({t})" for n, (_, t) in COLUMNS.items())
    by_lower = {n.lower(): n for n in COLUMNS}
    columns: dict[str, str] = {}
    unknown: list[str] = []
    for f in schema.fields:
        canonical = by_lower.get(f.name.lower())
        if canonical is None:
            unknown.append(f.name)
        elif canonical in columns:
            raise SparkOptionError(f"the tidemq sink got columns {columns[canonical]!r} and "
                                   f"{f.name!r}, which both mean {canonical}; keep one")
        else:
            columns[canonical] = f.name
    if unknown:
        raise SparkOptionError(
            f"the tidemq sink does not know the column(s) {', '.join(map(repr, unknown))}; it accepts "
            f"{accepted} (select only these, e.g. df.selectExpr('CAST(id AS STRING) AS key', "
            "'to_json(struct(*)) AS value'))")
    if "value" not in columns:
        raise SparkOptionError(
            "the tidemq sink needs a 'value' column (string or binary) holding the message bodies; "
            f"it accepts {accepted}")
    types = {f.name: f.dataType for f in schema.fields}
    for canonical, name in columns.items():
        allowed, shown = COLUMNS[canonical]
        dt = types[name]
        ok = isinstance(dt, allowed)
        if ok and isinstance(dt, MapType):
            ok = isinstance(dt.keyType, StringType) and isinstance(dt.valueType, StringType)
        if not ok:
            raise SparkOptionError(
                f"column {name!r} of the tidemq sink must be {shown}, not {dt.simpleString()}; "
                f"cast it, e.g. CAST({name} AS {_cast_hint(canonical)})")
    if opts.topic is None and "topic" not in columns:
        raise SparkOptionError(
            "the tidemq sink needs a destination topic: set .option('topic', 'orders') or add a "
            "string column 'topic'")
    if opts.topic is not None:
        try:
            check_send_topic(opts.topic)
        except TideMQError as exc:
            raise SparkOptionError(f"option topic: {exc}") from None
    return columns


def _cast_hint(canonical: str) -> str:
    return {"properties": "MAP<STRING,STRING>", "queueId": "INT", "value": "STRING"}.get(
        canonical, "STRING")


def _log_commit(messages: list[Any], batch_id: int | None) -> None:
    done = [m for m in messages if isinstance(m, SinkCommitMessage)]
    topics: dict[str, int] = {}
    for m in done:
        for t, n in m.topics.items():
            topics[t] = topics.get(t, 0) + n
    log.info("tidemq sink%s committed: %d message(s), %d body byte(s) from %d task(s); per topic %s",
             "" if batch_id is None else f" batch {batch_id}", sum(m.messages for m in done),
             sum(m.bytes for m in done), len(done), topics)


def _log_abort(messages: list[Any], batch_id: int | None) -> None:
    sent = sum(m.messages for m in messages if isinstance(m, SinkCommitMessage))
    log.warning("tidemq sink%s aborted: the %d message(s) its finished tasks sent (and any that "
                "failed tasks had sent) stay in their topics; the sink is at-least-once",
                "" if batch_id is None else f" batch {batch_id}", sent)


# executor side ----------------------------------------------------------------------------------


def _partition_id() -> int | None:
    from pyspark import TaskContext
    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else None


class _Task:
    """One write task: rows -> messages, grouped by (topic, queueId) and sent in batches."""

    def __init__(self, opts: SinkOptions, columns: dict[str, str]) -> None:
        self.opts = opts
        self.columns = columns
        self.partition = _partition_id()
        self.row = 0  # position of the next row within this task's input
        self.sent = 0
        self.bytes = 0
        self.per_topic: dict[str, int] = {}
        self.pending: dict[tuple[str, int | None], list[Message]] = {}
        self.checked_topics: set[str] = set()
        self.queues: dict[str, list[MessageQueue]] = {}
        self.cfg = client_config(opts.name_servers, opts.credentials, opts.send_timeout_ms)
        self.producer_key = ("sink-producer", opts.producer_group, self.cfg)

    # rows -> messages
    def add_columns(self, cols: dict[str, list], n: int) -> None:
        """Add ``n`` rows given as canonical column name -> list of Python values."""
        values = cols["value"]
        keys, tags, topics = cols.get("key"), cols.get("tags"), cols.get("topic")
        props, qids = cols.get("properties"), cols.get("queueId")
        fixed_topic = self.opts.topic
        for i in range(n):
            topic = fixed_topic or (topics[i] if topics is not None else None)
            msg = self._message(topic, values[i], keys[i] if keys is not None else None,
                                tags[i] if tags is not None else None,
                                props[i] if props is not None else None)
            qid = qids[i] if qids is not None else None
            if qid is not None and qid < 0:
                raise self._row_error(f"has queueId {qid}; queue ids are >= 0")
            group = self.pending.setdefault((msg.topic, qid), [])
            group.append(msg)
            self.row += 1
            if len(group) >= self.opts.send_batch_size:
                self._flush((msg.topic, qid))

    def _message(self, topic: str | None, value: Any, key: Any, tags: str | None,
                 props: Any) -> Message:
        if topic is None:
            raise self._row_error("has a null topic and the option topic is not set")
        if topic not in self.checked_topics:
            try:
                check_send_topic(topic)
            except TideMQError as exc:
                raise self._row_error(f"cannot be sent: {exc}") from None
            self.checked_topics.add(topic)
        if value is None:
            raise self._row_error("has a null value; a RocketMQ message needs a body: filter such "
                                  "rows out, e.g. df.where('value IS NOT NULL')")
        body = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        if isinstance(key, (bytes, bytearray)):
            try:
                key = bytes(key).decode("utf-8")
            except UnicodeDecodeError:
                raise self._row_error("has a key that is not UTF-8 text; RocketMQ keys are "
                                      "strings (the KEYS property)") from None
        properties = self._properties(props) if props else {}
        msg = Message(topic, body, tags or None, key or None, properties)
        try:
            check_body(body, MAX_MESSAGE_SIZE)
            if properties or msg.keys or msg.tags:
                check_properties(msg.all_properties())
        except ClientError as exc:
            raise self._row_error(f"cannot be sent: {exc}") from None
        return msg

    def _properties(self, props: Any) -> dict[str, str]:
        items = props.items() if isinstance(props, dict) else props  # Arrow maps: [(k, v), ...]
        out: dict[str, str] = {}
        for name, value in items:
            if name in RESERVED_PROPERTIES:
                raise self._row_error(
                    f"has property {name!r}, a name RocketMQ reserves for itself; rename it or drop "
                    "it, e.g. map_filter(properties, (k, v) -> k != '" + name + "')")
            if value is None or value == "":
                raise self._row_error(f"has property {name!r} with a null or empty value; "
                                      "RocketMQ properties need a value")
            out[name] = value
        return out

    def _row_error(self, what: str) -> SinkError:
        where = f"row {self.row} of Spark partition {self.partition}" if self.partition is not None \
            else f"row {self.row} of this task"
        return SinkError(f"tidemq sink: {where} {what}{self._sent_note()}")

    def _sent_note(self) -> str:
        if not self.sent:
            return " (this task had sent no message yet)"
        return (f" (this task had already sent {self.sent} message(s), which stay in their topics: "
                f"{self._topics_text()})")

    def _topics_text(self) -> str:
        return ", ".join(f"{t}: {n}" for t, n in sorted(self.per_topic.items()))

    # sending
    def _producer(self) -> Any:
        from tidemq.client.sync import SyncProducer

        def make() -> SyncProducer:
            producer = SyncProducer(self.opts.producer_group, config=self.cfg)
            producer.start()
            return producer
        return cached(self.producer_key, make)

    def _queue(self, topic: str, qid: int) -> MessageQueue:
        queues = self.queues.get(topic)
        if queues is None:
            from tidemq.client.sync import SyncAdmin

            def make() -> SyncAdmin:
                admin = SyncAdmin(config=self.cfg)
                admin.start()
                return admin
            route = cached(("sink-admin", self.cfg), make).topic_route(topic)
            queues = self.queues[topic] = route.publish_queues(topic)
        if qid >= len(queues):
            raise SinkError(
                f"tidemq sink: queueId {qid} is out of range: topic {topic} has {len(queues)} "
                f"publish queue(s), ids 0..{len(queues) - 1}{self._sent_note()}")
        return queues[qid]

    def _flush(self, group: tuple[str, int | None]) -> None:
        msgs = self.pending.pop(group, None)
        if not msgs:
            return
        topic, qid = group
        try:
            queue = self._queue(topic, qid) if qid is not None else None
            producer = self._producer()
            for part in split_batches(msgs, MAX_MESSAGE_SIZE):
                producer.send_batch(part, queue)
                self.sent += len(part)
                self.bytes += sum(len(m.body) for m in part)
                self.per_topic[topic] = self.per_topic.get(topic, 0) + len(part)
        except SinkError:
            raise
        except TideMQError as exc:
            if isinstance(exc, RemotingError):  # a broken connection: reconnect on the retry
                drop(self.producer_key)
            raise SinkError(
                f"tidemq sink: sending to topic {topic}"
                f"{'' if qid is None else f' queue {qid}'} failed{self._sent_note()}: {exc}"
            ) from exc

    def finish(self) -> SinkCommitMessage:
        for group in list(self.pending):
            self._flush(group)
        log.info("tidemq sink task (partition %s) sent %d message(s), %d body byte(s): %s",
                 self.partition, self.sent, self.bytes, self._topics_text() or "nothing")
        return SinkCommitMessage(self.sent, self.bytes, dict(self.per_topic), self.partition)


def write_arrow(opts: SinkOptions, columns: dict[str, str], batches: Iterable[Any]
                ) -> SinkCommitMessage:
    """Send every row of ``batches`` (pyarrow RecordBatches); see :class:`_Task`."""
    task = _Task(opts, columns)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        cols = {c: batch.column(name).to_pylist() for c, name in columns.items()}
        task.add_columns(cols, batch.num_rows)
    return task.finish()


def write_rows(opts: SinkOptions, columns: dict[str, str], rows: Iterable[Any]) -> SinkCommitMessage:
    """The same for Spark Rows (PySpark 4.0 streaming writers), gathered into columns."""
    task = _Task(opts, columns)
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= ROWS_PER_CHUNK:
            _add_rows(task, columns, chunk)
            chunk = []
    if chunk:
        _add_rows(task, columns, chunk)
    return task.finish()


def _add_rows(task: _Task, columns: dict[str, str], chunk: list[Any]) -> None:
    cols = {c: [row[name] for row in chunk] for c, name in columns.items()}
    task.add_columns(cols, len(chunk))


# the writers Spark calls --------------------------------------------------------------------------


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("tidemq")``: checks the schema on the driver, sends on the executors."""

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        self.opts = opts
        self.columns = check_sink_schema(schema, opts, overwrite)

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return write_arrow(self.opts, self.columns, iterator)

    def commit(self, messages: list[Any]) -> None:
        _log_commit(messages, None)

    def abort(self, messages: list[Any]) -> None:
        _log_abort(messages, None)


class StreamWriter(_StreamWriterBase):
    """``df.writeStream.format("tidemq")``: one write per task of each micro-batch."""

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        self.opts = opts
        self.columns = check_sink_schema(schema, opts, overwrite)

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        if STREAM_ARROW:
            return write_arrow(self.opts, self.columns, iterator)
        return write_rows(self.opts, self.columns, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 (Spark's name)
        _log_commit(messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        _log_abort(messages, batchId)
