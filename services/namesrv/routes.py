"""The name server's route table: which brokers exist, where they listen, which topics they serve.

Pure in-memory state, no I/O; time comes from an injected clock (seconds). Mirrors RocketMQ 4.x's
RouteInfoManager semantics:

* a cluster maps to broker names; a broker name to one BrokerData (cluster, name, id -> "ip:port");
  a topic to {broker name: QueueData}; a live broker address to its last registration time, the
  data version of its topic table and the connection it registered over;
* only a master (broker id 0) registration writes queue data: on its first registration every
  topic; later a topic whose queue data was not written under the registration's data version
  (RocketMQ 5's ``isTopicConfigChanged``): a changed version rewrites every topic, an unchanged one
  only adds the topics not seen under it. So a registration split into parts with one data version
  merges, and a wiped write permission stays wiped until the broker's topics change; an address
  registering under a new id leaves its old id;
* dropping a broker address (unregister, expiry, closed connection) removes it from its BrokerData;
  when a broker name has no address left, the name leaves its cluster and its queue data goes;
* a topic with no queue data left disappears; a cluster with no broker name left disappears.

Everything returned is a fresh plain value (dicts with string keys, lists), ready for JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace

from tidemq.remoting.codes import Perm
from tidemq.remoting.frame import lenient_int

log = logging.getLogger(__name__)

MASTER_ID = 0
# TopicConfig defaults of RocketMQ, used when a registered topic config omits a field.
DEFAULT_QUEUE_NUMS = 16
DEFAULT_PERM = 6


@dataclass(frozen=True, slots=True)
class QueueData:
    """What one broker serves of one topic."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0
    # The broker's data version this was registered under (not part of the route).
    version: object = field(default=None, compare=False)

    def to_json(self) -> dict[str, object]:
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }


@dataclass(slots=True)
class BrokerData:
    """One broker name (a master and its slaves): broker id -> "ip:port"."""

    cluster: str
    broker_name: str
    addrs: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        # Quoted numeric keys: standard JSON that cpp, Java (>= 4.9.4 style) and Go all read.
        return {
            "brokerAddrs": {str(bid): addr for bid, addr in sorted(self.addrs.items())},
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }


@dataclass(slots=True)
class BrokerLiveInfo:
    """A registered broker address: when it last registered, its topic-table version, its link."""

    last_update: float
    data_version: dict | None
    conn_key: Hashable | None
    ha_server_addr: str = ""


def _as_int(value: object, what: str, default: int) -> int:
    try:
        return lenient_int(value, default, bools=False)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {value!r}") from None


def queue_data_from_config(topic: str, broker_name: str, config: Mapping[str, object]) -> QueueData:
    """The queue data a TopicConfig (as registered by a broker) stands for. Raises ValueError."""
    if not isinstance(config, Mapping):
        raise ValueError(f"topic config of {topic!r} is not a JSON object")
    return QueueData(
        broker_name=broker_name,
        read_queue_nums=_as_int(
            config.get("readQueueNums"), f"{topic}.readQueueNums", DEFAULT_QUEUE_NUMS
        ),
        write_queue_nums=_as_int(
            config.get("writeQueueNums"), f"{topic}.writeQueueNums", DEFAULT_QUEUE_NUMS
        ),
        perm=_as_int(config.get("perm"), f"{topic}.perm", DEFAULT_PERM),
        topic_sys_flag=_as_int(config.get("topicSysFlag"), f"{topic}.topicSysFlag", 0),
    )


def _version_key(data_version: Mapping | None) -> object:
    """What makes two DataVersions equal in RocketMQ: timestamp and counter."""
    if data_version is None:
        return None
    return (data_version.get("timestamp"), data_version.get("counter"))


class RouteInfoManager:
    """Route state of one name server. Not thread-safe: used from one event loop."""

    def __init__(self, clock: Callable[[], float], broker_expiry: float = 120.0) -> None:
        self._clock = clock
        self.broker_expiry = broker_expiry
        self._clusters: dict[str, set[str]] = {}
        self._brokers: dict[str, BrokerData] = {}
        self._topics: dict[str, dict[str, QueueData]] = {}
        self._live: dict[str, BrokerLiveInfo] = {}

    # registration -------------------------------------------------------------------------------
    def register_broker(
        self,
        cluster: str,
        broker_name: str,
        broker_addr: str,
        broker_id: int,
        topic_configs: Mapping[str, Mapping[str, object]],
        data_version: dict | None,
        conn_key: Hashable | None = None,
        ha_server_addr: str = "",
    ) -> dict[str, str]:
        """Record a broker's (re-)registration. Returns the response info: ``haServerAddr`` and
        ``masterAddr`` of the master, for slaves whose master is known (else empty).

        Raises ValueError (before changing anything) if a topic config is malformed.
        """
        if not cluster or not broker_name or not broker_addr:
            raise ValueError("clusterName, brokerName and brokerAddr must not be empty")
        queue_datas = {
            str(topic): queue_data_from_config(str(topic), broker_name, cfg)
            for topic, cfg in topic_configs.items()
        }
        now = self._clock()
        self._clusters.setdefault(cluster, set()).add(broker_name)
        bd = self._brokers.get(broker_name)
        first = bd is None
        if bd is None:
            bd = self._brokers[broker_name] = BrokerData(cluster, broker_name)
        # A slave promoted to master (or the reverse) keeps its address under its new id only.
        for bid in [b for b, a in bd.addrs.items() if a == broker_addr and b != broker_id]:
            del bd.addrs[bid]
        first = bd.addrs.get(broker_id) is None or first
        bd.addrs[broker_id] = broker_addr

        prev = self._live.get(broker_addr)
        written = 0
        if broker_id == MASTER_ID:
            vkey = _version_key(data_version)
            for topic, qd in queue_datas.items():
                qmap = self._topics.setdefault(topic, {})
                cur = qmap.get(broker_name)
                if first or cur is None or cur.version != vkey:
                    qmap[broker_name] = replace(qd, version=vkey)
                    written += 1
        if written:
            log.info(
                "broker %s (%s, id %d, cluster %s) registered %d topics (%d written), data version %s",
                broker_name,
                broker_addr,
                broker_id,
                cluster,
                len(queue_datas),
                written,
                data_version,
            )
        elif prev is None:
            log.info(
                "broker %s (%s, id %d, cluster %s) registered",
                broker_name,
                broker_addr,
                broker_id,
                cluster,
            )
        self._live[broker_addr] = BrokerLiveInfo(now, data_version, conn_key, ha_server_addr)

        info = {"haServerAddr": "", "masterAddr": ""}
        if broker_id != MASTER_ID:
            master = bd.addrs.get(MASTER_ID)
            if master is not None and master in self._live:
                info["masterAddr"] = master
                info["haServerAddr"] = self._live[master].ha_server_addr
        return info

    def unregister_broker(
        self, cluster: str, broker_name: str, broker_addr: str, broker_id: int
    ) -> bool:
        """A broker leaving on purpose. Returns whether anything was removed."""
        removed = self._live.pop(broker_addr, None) is not None
        bd = self._brokers.get(broker_name)
        # Only its own entry: after a failover or hand-over the id may name another address by
        # now (the group's new master registered brokerId 0 before the old one unregistered).
        if bd is not None and bd.addrs.get(broker_id) == broker_addr:
            del bd.addrs[broker_id]
            removed = True
            if not bd.addrs:
                self._drop_broker_name(broker_name, cluster)
        if removed:
            log.info("broker %s (%s, id %d) unregistered", broker_name, broker_addr, broker_id)
        return removed

    def query_data_version(
        self, broker_addr: str, data_version: dict | None
    ) -> tuple[bool, dict | None]:
        """Whether ``data_version`` differs from the one stored for ``broker_addr`` (True when the
        broker is unknown), and the stored one. An unchanged answer refreshes the broker's liveness."""
        live = self._live.get(broker_addr)
        if live is None:
            return True, None
        changed = _version_key(live.data_version) != _version_key(data_version)
        if not changed:
            live.last_update = self._clock()
        return changed, live.data_version

    # liveness -----------------------------------------------------------------------------------
    def scan_expired(self) -> list[str]:
        """Drop brokers whose last registration is older than ``broker_expiry``; return their addrs."""
        deadline = self._clock() - self.broker_expiry
        expired = [addr for addr, live in self._live.items() if live.last_update < deadline]
        for addr in expired:
            self._drop_addr(addr)
        if expired:
            log.warning(
                "dropped %d broker(s) silent for more than %g s: %s",
                len(expired),
                self.broker_expiry,
                ", ".join(expired),
            )
        return expired

    def on_connection_closed(self, conn_key: Hashable) -> list[str]:
        """Drop every broker whose latest registration came over this connection; return addrs."""
        gone = [
            addr
            for addr, live in self._live.items()
            if live.conn_key is not None and live.conn_key == conn_key
        ]
        for addr in gone:
            self._drop_addr(addr)
        if gone:
            log.info("connection closed: dropped %d broker(s): %s", len(gone), ", ".join(gone))
        return gone

    def _drop_addr(self, addr: str) -> None:
        self._live.pop(addr, None)
        for name, bd in list(self._brokers.items()):
            for bid in [b for b, a in bd.addrs.items() if a == addr]:
                del bd.addrs[bid]
            if not bd.addrs:
                self._drop_broker_name(name, bd.cluster)

    def _drop_broker_name(self, broker_name: str, cluster: str) -> None:
        bd = self._brokers.pop(broker_name, None)
        for cname in {cluster, bd.cluster if bd is not None else cluster}:
            names = self._clusters.get(cname)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self._clusters[cname]
        for topic in list(self._topics):
            qmap = self._topics[topic]
            if qmap.pop(broker_name, None) is not None and not qmap:
                del self._topics[topic]

    # queries ------------------------------------------------------------------------------------
    def pickup_topic_route(self, topic: str) -> dict[str, object] | None:
        """TopicRouteData for ``topic``, or None when no live broker serves it."""
        qmap = self._topics.get(topic)
        if not qmap:
            return None
        broker_datas = [self._brokers[n].to_json() for n in sorted(qmap) if n in self._brokers]
        if not broker_datas:
            return None
        return {
            "brokerDatas": broker_datas,
            "filterServerTable": {},
            "queueDatas": [qmap[n].to_json() for n in sorted(qmap)],
        }

    def cluster_info(self) -> dict[str, object]:
        return {
            "brokerAddrTable": {n: bd.to_json() for n, bd in sorted(self._brokers.items())},
            "clusterAddrTable": {c: sorted(names) for c, names in sorted(self._clusters.items())},
        }

    def all_topics(self) -> list[str]:
        return sorted(self._topics)

    def topics_by_cluster(self, cluster: str) -> list[str]:
        names = self._clusters.get(cluster, set())
        return sorted(t for t, qmap in self._topics.items() if not names.isdisjoint(qmap))

    def broker_addrs(self) -> list[str]:
        """Addresses of every live (registered, not expired) broker."""
        return sorted(self._live)

    @property
    def broker_count(self) -> int:
        return len(self._live)

    @property
    def topic_count(self) -> int:
        return len(self._topics)

    # admin --------------------------------------------------------------------------------------
    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Forget a topic everywhere, or only its queue data on ``cluster``'s brokers.
        Returns whether anything was removed."""
        if cluster is None:
            removed = self._topics.pop(topic, None) is not None
        else:
            qmap = self._topics.get(topic)
            names = self._clusters.get(cluster)
            if qmap is None or not names:
                return False
            removed = False
            for name in names:
                removed = qmap.pop(name, None) is not None or removed
            if not qmap:
                del self._topics[topic]
        if removed:
            log.info("topic %s deleted%s", topic, f" from cluster {cluster}" if cluster else "")
        return removed

    def wipe_write_perm(self, broker_name: str) -> int:
        """Clear the WRITE bit of every topic on ``broker_name``; return how many topics it serves.
        Producers stop choosing the broker at their next route refresh (graceful drain)."""
        return self._set_write(broker_name, False)

    def add_write_perm(self, broker_name: str) -> int:
        """Set the WRITE bit again (other bits kept) on every topic of ``broker_name``; return count."""
        return self._set_write(broker_name, True)

    def _set_write(self, broker_name: str, writable: bool) -> int:
        count = 0
        for qmap in self._topics.values():
            qd = qmap.get(broker_name)
            if qd is None:
                continue
            perm = qd.perm | Perm.WRITE if writable else qd.perm & ~Perm.WRITE
            qmap[broker_name] = replace(qd, perm=int(perm))
            count += 1
        log.info(
            "%s write permission of broker %s on %d topics",
            "added" if writable else "wiped",
            broker_name,
            count,
        )
        return count
