"""Registration of a broker with every name server: at start, every 30 s, after topic changes,
and an unregister at shutdown. A name server that is down is retried at the next round.

The REGISTER_BROKER body is RocketMQ's RegisterBrokerBody in one of its two forms:

* plain JSON ``{"topicConfigSerializeWrapper":{"topicConfigTable":{..},"dataVersion":{..}},
  "filterServerList":[]}``;
* compressed (header ``compressed=true``, RocketMQ 4.9's ``RegisterBrokerBody.encode(true)``): a zlib
  stream of :data:`LENGTH` (big-endian int32) length-prefixed parts: the DataVersion JSON, then an
  int32 topic count and one ``TopicConfig.encode()`` line per topic (``"name read write perm
  filterType"``), then the filter-server list JSON. That form carries no topicSysFlag or order flag.

The name server's decoder is ``tidemq.namesrv.bodies`` (broker and name server are independent
packages; tests/broker/test_register_body.py decodes what this module encodes).

Invariants:

* the body is compressed when ``compressed_register`` is set or the JSON form is larger than
  :data:`COMPRESS_ABOVE`; ``bodyCrc32`` is the CRC32 of the bytes sent;
* no request is larger than ``register_max_body`` (the name server refuses a frame over its limit
  and closes the connection, which would drop the broker out of every route). A registration that
  does not fit is split into parts of whole topics, each a complete REGISTER_BROKER with the same
  data version (name servers merge them: TideMQ's and RocketMQ 5's apply a topic they have not seen
  under that data version), and the registrar logs a warning naming the topic count and sizes on
  every round. If even one topic per part does not fit, nothing is sent and an error says so on
  every round: the broker is never dropped silently;
* encoding runs in a worker thread, on a snapshot of the topic table taken on the event loop;
* :attr:`NamesrvRegistrar.announced` (the broker's readiness) turns true when a name server first
  accepts every part of a registration, and stays true: clients can find the broker from then on.
  Until then :meth:`NamesrvRegistrar.run` retries with a backoff from :data:`RETRY_FIRST` seconds
  up to the registration period, so a broker started before its name servers is ready soon after
  one of them listens;
* every request to a name server is signed when ``namesrv_access_key``/``namesrv_secret_key`` are
  set (name servers started with ``--acl-file`` refuse unsigned registrations).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from tidemq.errors import TideMQError
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.acl import AclSigner
from tidemq.remoting.tls import client_context
from tidemq.remoting.transport import TLS_MAYBE_NOT_SERVED, TLS_MAYBE_REQUIRED

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.topics import TopicConfigManager

log = logging.getLogger(__name__)

LENGTH = struct.Struct(">i")  # length prefix of every part, and the topic count
# A JSON body larger than this goes compressed even without compressed_register.
COMPRESS_ABOVE = 1024 * 1024
# What a name server inflates at most (tidemq.namesrv.bodies.MAX_INFLATED): a part never exceeds it.
MAX_INFLATED = 64 * 1024 * 1024
ZLIB_LEVEL = 9  # RocketMQ: Deflater.BEST_COMPRESSION
FILTER_SERVERS = b"[]"
# Until a name server first accepts the broker, rounds are retried after this many seconds,
# doubling up to the registration period.
RETRY_FIRST = 1.0


def _topic_line(name: str, cfg: Mapping[str, object]) -> bytes:
    """RocketMQ's TopicConfig.encode(): name, read, write, perm, filter type, space separated."""
    return (f"{name} {cfg.get('readQueueNums', 16)} {cfg.get('writeQueueNums', 16)} "
            f"{cfg.get('perm', 6)} {cfg.get('topicFilterType', 'SINGLE_TAG')}").encode()


def encode_json(topics: Mapping[str, Mapping[str, object]], data_version: Mapping[str, object]) -> bytes:
    return orjson.dumps({
        "topicConfigSerializeWrapper": {"topicConfigTable": topics, "dataVersion": data_version},
        "filterServerList": [],
    })


def raw_compressed_form(topics: Mapping[str, Mapping[str, object]], data_version: Mapping[str, object]) -> bytes:
    """The compressed form before deflating (its size bounds what the name server inflates)."""
    parts = []
    dv = orjson.dumps(data_version)
    parts += [LENGTH.pack(len(dv)), dv, LENGTH.pack(len(topics))]
    for name, cfg in topics.items():
        line = _topic_line(name, cfg)
        parts += [LENGTH.pack(len(line)), line]
    parts += [LENGTH.pack(len(FILTER_SERVERS)), FILTER_SERVERS]
    return b"".join(parts)


def encode_compressed(topics: Mapping[str, Mapping[str, object]], data_version: Mapping[str, object]) -> bytes:
    return zlib.compress(raw_compressed_form(topics, data_version), ZLIB_LEVEL)


@dataclass(frozen=True, slots=True)
class RegistrationPlan:
    """What one round sends: ``bodies`` (one per request, in order; empty when nothing fits),
    whether they are compressed, and the sizes for the log and metrics."""

    bodies: tuple[bytes, ...]
    compressed: bool
    topics: int
    json_bytes: int  # size of the whole table as one JSON body
    body_bytes: int  # size of the whole table as sent in one body (compressed when compressed)

    @property
    def split(self) -> bool:
        return len(self.bodies) > 1

    @property
    def sent_bytes(self) -> int:
        return sum(len(b) for b in self.bodies)


def plan_registration(
    topics: Mapping[str, Mapping[str, object]],
    data_version: Mapping[str, object],
    max_body: int,
    compressed: bool = False,
) -> RegistrationPlan:
    """Encode a registration (pure, CPU-bound: run it in a worker thread). One body when it fits
    in ``max_body``; else the topics are cut into the fewest equal parts (by count) whose bodies
    all fit, each carrying the same data version."""
    whole = encode_json(topics, data_version)
    compress = compressed or len(whole) > COMPRESS_ABOVE
    encode = encode_compressed if compress else encode_json
    first = encode(topics, data_version) if compress else whole
    if len(first) <= max_body and (not compress or len(raw_compressed_form(topics, data_version)) <= MAX_INFLATED):
        return RegistrationPlan((first,), compress, len(topics), len(whole), len(first))
    names = list(topics)
    n = max(2, -(-len(first) // max(1, int(max_body * 0.8))))
    while names:
        n = min(n, len(names))
        tables = [{name: topics[name] for name in names[i * len(names) // n:(i + 1) * len(names) // n]}
                  for i in range(n)]
        bodies = [encode(t, data_version) for t in tables]
        if all(len(b) <= max_body for b in bodies) and (
                not compress or all(len(raw_compressed_form(t, data_version)) <= MAX_INFLATED for t in tables)):
            return RegistrationPlan(tuple(bodies), compress, len(topics), len(whole), len(first))
        if n == len(names):
            break
        n *= 2
    return RegistrationPlan((), compress, len(topics), len(whole), len(first))


def _masked(cfg: dict, broker_permission: int) -> dict:
    """A topic's TopicConfig JSON as registered: its READ/WRITE bits only where the broker has them."""
    if broker_permission & 6 == 6:
        return cfg
    return {**cfg, "perm": int(cfg.get("perm", 6)) & (broker_permission | ~6)}


def _hint(max_body: int) -> str:
    """What an operator can do about a registration that needs splitting or does not fit."""
    return ("delete topics the broker no longer needs (retry topics of gone consumer groups, "
            "auto-created topics), or raise --register-max-body together with the name servers' "
            f"frame limit (now {max_body} bytes)")


class NamesrvRegistrar:
    def __init__(self, *, settings: Callable[[], BrokerConfig], topics: TopicConfigManager,
                 broker_id: Callable[[], int] | None = None) -> None:
        self._settings = settings  # the broker's config of the moment (UPDATE_BROKER_CONFIG replaces it)
        self._topics = topics
        # A replica's brokerId follows its role (tidemq.broker.ha.replica); else the configured one.
        self._broker_id = broker_id
        # The master's HA address the last round's answers named (RocketMQ RegisterBrokerResult
        # haServerAddr, given to slaves only): "" when none did.
        self.master_ha_addr = ""
        self._ha_answers: list[str] = []
        cfg = settings()
        tls = cfg.namesrv_tls
        ak, sk = cfg.namesrv_access_key, cfg.namesrv_secret_key
        self.client = RemotingClient(
            connect_timeout=3.0, ssl_context=client_context(tls), server_name=tls.server_name,
            rpc_hook=AclSigner(ak, sk) if ak and sk else None,
        )
        self._lock = asyncio.Lock()
        self._registered_permission = cfg.broker_permission  # what the last round registered
        self.registered: set[str] = set()
        self._announced = False  # some name server accepted a whole registration since start
        # For metrics (tidemq.broker.metrics may read them): the last round's plan.
        self.body_bytes = 0          # bytes sent to each name server in the last round
        self.parts = 0               # requests per name server in the last round (0: nothing fit)
        self.rounds_not_sent = 0     # rounds where the registration did not fit at all

    def _header(self) -> dict[str, object]:
        cfg = self._settings()
        return {
            "brokerName": cfg.broker_name,
            "brokerAddr": cfg.advertise_addr,
            "clusterName": cfg.cluster_name,
            "haServerAddr": cfg.replica.ha_advertise if cfg.replica is not None
            else f"{cfg.advertise_host}:{cfg.advertise_port + 1}",
            "brokerId": cfg.broker_id if self._broker_id is None else self._broker_id(),
            "compressed": "false",
        }

    @property
    def max_body(self) -> int:
        return self._settings().register_max_body

    @property
    def announced(self) -> bool:
        """Whether clients can find this broker: a name server accepted its registration since
        start (or it is configured with none). Never false again once true: a name server lost
        later is the name servers' outage, not a reason to take the broker out of service."""
        return self._announced or not self._settings().namesrv_addrs

    async def run(self, interval: float) -> None:
        """Register every ``interval`` seconds (the caller registered once already); while no
        name server has accepted yet, sooner (:data:`RETRY_FIRST`, doubling up to ``interval``)."""
        delay = RETRY_FIRST
        while True:
            await asyncio.sleep(interval if self.announced else min(delay, interval))
            delay = min(delay * 2, interval)
            try:
                await self.register_all()
            except Exception:  # a bug in one round must not end registration
                log.exception("registration round failed")

    async def register_all(self) -> int:
        """Register with every name server; return how many accepted every part."""
        async with self._lock:
            cfg = self._settings()
            topics = self._topics
            # Snapshot on the loop (TopicConfig values are frozen), encode in a worker thread.
            # A broker read-only by brokerPermission (retiring: updateBrokerConfig brokerPermission=4)
            # registers its topics without WRITE, so the name servers route producers elsewhere
            # (RocketMQ's registerBrokerAll masks each topic's perm the same way).
            mask = cfg.broker_permission
            if mask != self._registered_permission:  # name servers rewrite routes for a new version only
                topics.touch()
                self._registered_permission = mask
            snapshot = dict(topics.topics)
            version = topics.data_version()
            compressed, max_body = cfg.compressed_register, self.max_body
            plan = await asyncio.to_thread(
                lambda: plan_registration({n: _masked(tc.to_json(), mask) for n, tc in snapshot.items()},
                                          version, max_body, compressed))
            self.body_bytes, self.parts = plan.sent_bytes, len(plan.bodies)
            self._log_plan(plan, max_body)
            if not plan.bodies:
                self.rounds_not_sent += 1
                return 0
            header = self._header()
            header["compressed"] = "true" if plan.compressed else "false"
            self._ha_answers = []
            results = await asyncio.gather(
                *(self._register_one(addr, header, plan) for addr in cfg.namesrv_addrs)
            )
            self.master_ha_addr = next((a for a in self._ha_answers if a), "")
            return sum(results)

    def _log_plan(self, plan: RegistrationPlan, max_body: int) -> None:
        form = "compressed" if plan.compressed else "JSON"
        if not plan.bodies:
            log.error(
                "NOT registered with the name servers: %d topics make a %s body of %d bytes (JSON %d) "
                "and no split into parts fits the %d-byte limit; clients cannot route to this broker "
                "once the name servers expire it. %s",
                plan.topics, form, plan.body_bytes, plan.json_bytes, max_body, _hint(max_body))
        elif plan.split:
            log.warning(
                "registration of %d topics is a %s body of %d bytes (JSON %d), over the %d-byte limit: "
                "sent as %d requests of whole topics (name servers older than RocketMQ 5 keep only "
                "the first); %s",
                plan.topics, form, plan.body_bytes, plan.json_bytes, max_body, len(plan.bodies),
                _hint(max_body))

    async def _register_one(self, addr: str, header: dict, plan: RegistrationPlan) -> bool:
        for i, body in enumerate(plan.bodies):
            fields = dict(header, bodyCrc32=zlib.crc32(body) & 0x7FFFFFFF)
            cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body)
            part = f" (part {i + 1} of {len(plan.bodies)})" if plan.split else ""
            try:
                resp = await self.client.invoke(addr, cmd, self._settings().register_timeout)
            except TideMQError as exc:
                if TLS_MAYBE_REQUIRED in str(exc) or TLS_MAYBE_NOT_SERVED in str(exc):
                    log.warning("registration%s with name server %s (%d bytes) failed: %s; %s", part, addr,
                                len(body), exc,
                                "if that name server requires TLS, start this broker with --namesrv-tls "
                                "(verified with --tls-ca-file)" if TLS_MAYBE_REQUIRED in str(exc) else
                                "for a plaintext name server, start this broker without --namesrv-tls")
                elif addr in self.registered:
                    log.warning("registration with name server %s failed%s, body %d bytes: %s",
                                addr, part, len(body), exc)
                else:  # the size tells a frame-limit refusal (the name server closes) from a down server
                    log.info("name server %s not reachable yet (registration%s of %d bytes): %s",
                             addr, part, len(body), exc)
                self.registered.discard(addr)
                return False
            if resp.code != ResponseCode.SUCCESS:
                log.warning("name server %s refused registration%s (%d): %s", addr, part, resp.code, resp.remark)
                self.registered.discard(addr)
                return False
            self._ha_answers.append(resp.get_str("haServerAddr") or "")
        if addr not in self.registered:
            cfg = self._settings()
            log.info(
                "registered %s (%s) with name server %s, %d topics in %d request(s) of %d bytes (%s)",
                cfg.broker_name, cfg.advertise_addr, addr,
                plan.topics, len(plan.bodies), plan.sent_bytes, "compressed" if plan.compressed else "JSON",
            )
        self.registered.add(addr)
        self._announced = True
        return True

    async def unregister_all(self) -> None:
        header = {k: v for k, v in self._header().items() if k in ("brokerName", "brokerAddr", "clusterName", "brokerId")}
        for addr in self._settings().namesrv_addrs:
            cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header)
            try:
                resp = await self.client.invoke(addr, cmd, 3.0)
            except TideMQError as exc:
                log.info("could not unregister from %s: %s", addr, exc)
                continue
            if resp.code != ResponseCode.SUCCESS:
                log.warning("name server %s refused the unregistration (%d): %s", addr, resp.code, resp.remark)
        await self.client.close()
