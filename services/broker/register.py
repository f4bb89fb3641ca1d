"""Registration of a broker with every name server: at start, every 30 s, after topic changes,
and an unregister at shutdown. A name server that is down is retried at the next round."""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import TYPE_CHECKING

import orjson

from tidemq.errors import TideMQError
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.tls import client_context

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

log = logging.getLogger(__name__)


class NamesrvRegistrar:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        tls = broker.config.namesrv_tls
        self.client = RemotingClient(connect_timeout=3.0, ssl_context=client_context(tls), server_name=tls.server_name)
        self._lock = asyncio.Lock()
        self.registered: set[str] = set()

    def _header(self) -> dict[str, object]:
        cfg = self.broker.config
        return {
            "brokerName": cfg.broker_name,
            "brokerAddr": cfg.advertise_addr,
            "clusterName": cfg.cluster_name,
            "haServerAddr": f"{cfg.advertise_host}:{cfg.advertise_port + 1}",
            "brokerId": cfg.broker_id,
            "compressed": "false",
        }

    async def register_all(self) -> int:
        """Register with every name server; return how many accepted."""
        async with self._lock:
            cfg = self.broker.config
            body = orjson.dumps(
                {"topicConfigSerializeWrapper": self.broker.topics.wrapper(), "filterServerList": []}
            )
            header = self._header()
            header["bodyCrc32"] = zlib.crc32(body) & 0x7FFFFFFF
            results = await asyncio.gather(
                *(self._register_one(addr, header, body) for addr in cfg.namesrv_addrs)
            )
            return sum(results)

    async def _register_one(self, addr: str, header: dict, body: bytes) -> bool:
        cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, header, body)
        try:
            resp = await self.client.invoke(addr, cmd, self.broker.config.register_timeout)
        except TideMQError as exc:
            if addr in self.registered:
                log.warning("registration with name server %s failed: %s", addr, exc)
            else:
                log.info("name server %s not reachable yet: %s", addr, exc)
            self.registered.discard(addr)
            return False
        if resp.code != ResponseCode.SUCCESS:
            log.warning("name server %s refused registration (%d): %s", addr, resp.code, resp.remark)
            return False
        if addr not in self.registered:
            log.info(
                "registered %s (%s) with name server %s, %d topics",
                self.broker.config.broker_name, self.broker.config.advertise_addr, addr,
                len(self.broker.topics.topics),
            )
        self.registered.add(addr)
        return True

    async def unregister_all(self) -> None:
        header = {k: v for k, v in self._header().items() if k in ("brokerName", "brokerAddr", "clusterName", "brokerId")}
        for addr in self.broker.config.namesrv_addrs:
            cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header)
            try:
                await self.client.invoke(addr, cmd, 3.0)
            except TideMQError as exc:
                log.info("could not unregister from %s: %s", addr, exc)
        await self.client.close()
