"""Topic routes and cluster info as the name server describes them: pure parsing, no I/O.

Route bodies come from Java (fastjson: ``brokerAddrs`` keys may be bare integers ``{0:"..."}``)
or from TideMQ (quoted ``{"0":"..."}``); both parse the same. Numbers given as strings are
accepted. Derived queue lists follow both RocketMQ clients:

* publish queues: brokers whose queue data has WRITE permission *and* a master (id 0) address,
  queues ``0..writeQueueNums-1``, brokers in name order (or ``orderTopicConf`` when present);
  ordered queues (a selector's choice) the same, but a group without a master keeps its queues;
* subscribe queues: brokers with READ permission, queues ``0..readQueueNums-1``.

Both lists are sorted by (topic, broker name, queue id), the order rebalancing relies on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntFlag

from tidemq.errors import CodecError, FrameError
from tidemq.remoting import fastjson

MASTER_ID = 0


class Perm(IntFlag):
    """Topic/broker permission bits (RocketMQ PermName)."""

    INHERIT = 1
    WRITE = 2
    READ = 4
    PRIORITY = 8

    @classmethod
    def read_write(cls) -> "Perm":
        return cls.READ | cls.WRITE


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker. Orders by (topic, broker_name, queue_id)."""

    topic: str
    broker_name: str
    queue_id: int

    def as_json(self) -> dict[str, object]:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}

    @classmethod
    def from_json(cls, obj: object) -> "MessageQueue":
        if not isinstance(obj, dict):
            raise CodecError(f"message queue is not an object: {obj!r}")
        try:
            return cls(str(obj["topic"]), str(obj["brokerName"]), int(obj["queueId"]))
        except (KeyError, TypeError, ValueError):
            raise CodecError(f"message queue lacks topic/brokerName/queueId: {obj!r}") from None

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}#{self.queue_id}"


@dataclass(frozen=True, slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: Perm
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "brokerName": self.broker_name,
            "perm": int(self.perm),
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @property
    def writable(self) -> bool:
        return bool(self.perm & Perm.WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & Perm.READ)


@dataclass(frozen=True, slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def any_addr(self) -> str | None:
        """The master's address, else the lowest-id slave's."""
        if MASTER_ID in self.broker_addrs:
            return self.broker_addrs[MASTER_ID]
        return self.broker_addrs[min(self.broker_addrs)] if self.broker_addrs else None


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    order_topic_conf: str | None = None

    @classmethod
    def from_json(cls, body: bytes | str | dict) -> "TopicRouteData":
        obj = _load(body, "topic route")
        if not isinstance(obj, dict):
            raise CodecError("topic route body is not a JSON object")
        qds = tuple(_queue_data(q) for q in _list(obj.get("queueDatas"), "queueDatas"))
        bds = tuple(_broker_data(b) for b in _list(obj.get("brokerDatas"), "brokerDatas"))
        otc = obj.get("orderTopicConf")
        return cls(qds, bds, otc if isinstance(otc, str) and otc else None)

    def to_json(self) -> dict[str, object]:
        """The name server's standard-JSON form (quoted broker ids)."""
        out: dict[str, object] = {
            "brokerDatas": [bd.to_json() for bd in self.broker_datas],
            "filterServerTable": {},
            "queueDatas": [qd.to_json() for qd in self.queue_datas],
        }
        if self.order_topic_conf:
            out["orderTopicConf"] = self.order_topic_conf
        return out

    def broker(self, broker_name: str) -> BrokerData | None:
        for bd in self.broker_datas:
            if bd.broker_name == broker_name:
                return bd
        return None

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """Queues a producer may write: WRITE perm and a master address (id 0)."""
        out: list[MessageQueue] = []
        if self.order_topic_conf:
            for item in self.order_topic_conf.split(";"):
                name, sep, nums = item.partition(":")
                if sep and nums.strip().isdigit():
                    out.extend(MessageQueue(topic, name.strip(), i) for i in range(int(nums)))
            return sorted(out)
        for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
            if not qd.writable:
                continue
            bd = self.broker(qd.broker_name)
            if bd is None or bd.master_addr is None:
                continue
            out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
        return sorted(out)

    def ordered_queues(self, topic: str) -> list[MessageQueue]:
        """Queues a selector chooses among (ordered sends): :meth:`publish_queues`, except that
        a broker group whose master is not registered (a failover in progress) keeps its queues,
        so that a key keeps its queue while the group elects a new master (the send waits for it)
        instead of moving to another group's queue behind its earlier messages."""
        if self.order_topic_conf:
            return self.publish_queues(topic)
        out: list[MessageQueue] = []
        for qd in self.queue_datas:
            bd = self.broker(qd.broker_name)
            if qd.writable and bd is not None and bd.broker_addrs:
                out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
        return sorted(out)

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """Queues a consumer reads: READ perm, ``0..readQueueNums-1``."""
        out: list[MessageQueue] = []
        for qd in self.queue_datas:
            if qd.readable:
                out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
        return sorted(out)

    def master_addrs(self) -> dict[str, str]:
        """broker name -> master address, for brokers that have one."""
        return {bd.broker_name: bd.master_addr for bd in self.broker_datas if bd.master_addr}


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO: brokers by name and broker names by cluster."""

    broker_addr_table: dict[str, BrokerData]
    cluster_addr_table: dict[str, tuple[str, ...]]

    @classmethod
    def from_json(cls, body: bytes | str | dict) -> "ClusterInfo":
        obj = _load(body, "cluster info")
        if not isinstance(obj, dict):
            raise CodecError("cluster info body is not a JSON object")
        brokers_raw = obj.get("brokerAddrTable") or {}
        clusters_raw = obj.get("clusterAddrTable") or {}
        if not isinstance(brokers_raw, dict) or not isinstance(clusters_raw, dict):
            raise CodecError("cluster info tables are not JSON objects")
        brokers: dict[str, BrokerData] = {}
        for name, raw in brokers_raw.items():
            bd = _broker_data(raw, default_name=str(name))
            brokers[bd.broker_name] = bd
        clusters = {
            str(c): tuple(sorted(str(n) for n in _list(names, "clusterAddrTable")))
            for c, names in clusters_raw.items()
        }
        return cls(brokers, clusters)

    def to_json(self) -> dict[str, object]:
        return {
            "brokerAddrTable": {n: bd.to_json() for n, bd in sorted(self.broker_addr_table.items())},
            "clusterAddrTable": {c: list(ns) for c, ns in sorted(self.cluster_addr_table.items())},
        }

    def master_addrs(self, cluster: str) -> dict[str, str]:
        """broker name -> master address for every broker of ``cluster`` that has a master."""
        out: dict[str, str] = {}
        for name in self.cluster_addr_table.get(cluster, ()):
            bd = self.broker_addr_table.get(name)
            if bd is not None and bd.master_addr:
                out[name] = bd.master_addr
        return out

    def all_master_addrs(self) -> dict[str, str]:
        return {n: bd.master_addr for n, bd in self.broker_addr_table.items() if bd.master_addr}


# ---------------------------------------------------------------------------------------------


def _load(body: bytes | str | dict, what: str) -> object:
    if isinstance(body, dict):
        return body
    try:
        return fastjson.loads(body)
    except (FrameError, TypeError) as exc:
        # TypeError: fastjson.loads meets an object key holding a nested object/array.
        raise CodecError(f"{what} body is not valid JSON: {exc}") from None


def _list(value: object, name: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise CodecError(f"{name} is not a JSON array")
    return value


def _int(obj: dict, key: str, default: int | None = None) -> int:
    v = obj.get(key, default)
    if v is None:
        raise CodecError(f"route entry lacks {key!r}: {obj!r}")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise CodecError(f"route field {key!r} is not an integer: {v!r}") from None


def _queue_data(raw: object) -> QueueData:
    if not isinstance(raw, dict) or not raw.get("brokerName"):
        raise CodecError(f"queue data entry without brokerName: {raw!r}")
    return QueueData(
        broker_name=str(raw["brokerName"]),
        read_queue_nums=_int(raw, "readQueueNums", 0),
        write_queue_nums=_int(raw, "writeQueueNums", 0),
        perm=Perm(_int(raw, "perm", 6) & 0xF),
        topic_sys_flag=_int(raw, "topicSysFlag", 0),
    )


def _broker_data(raw: object, default_name: str | None = None) -> BrokerData:
    if not isinstance(raw, dict):
        raise CodecError(f"broker data entry is not an object: {raw!r}")
    name = raw.get("brokerName") or default_name
    if not name:
        raise CodecError(f"broker data entry without brokerName: {raw!r}")
    addrs_raw = raw.get("brokerAddrs") or {}
    if not isinstance(addrs_raw, dict):
        raise CodecError(f"brokerAddrs of {name} is not an object")
    addrs: dict[int, str] = {}
    for k, v in addrs_raw.items():
        try:
            addrs[int(k)] = str(v)
        except (TypeError, ValueError):
            raise CodecError(f"brokerAddrs key {k!r} of {name} is not a broker id") from None
    return BrokerData(cluster=str(raw.get("cluster") or ""), broker_name=str(name), broker_addrs=addrs)
