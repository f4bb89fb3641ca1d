"""The name server's key-value configuration (PUT/GET/DELETE_KV_CONFIG): namespace -> key -> value.

In memory only: RocketMQ keeps it in ``kvConfig.json``; TideMQ name servers are stateless (brokers
re-register within 30 s of a restart), and the only namespace clients read, ORDER_TOPIC_CONFIG,
is optional. Invariant: a namespace with no key left is removed.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class KvConfigStore:
    def __init__(self) -> None:
        self._table: dict[str, dict[str, str]] = {}

    def put(self, namespace: str, key: str, value: str) -> None:
        prev = self._table.setdefault(namespace, {}).get(key)
        self._table[namespace][key] = value
        if prev != value:
            log.info("kv config %s/%s set", namespace, key)

    def get(self, namespace: str, key: str) -> str | None:
        return self._table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> bool:
        table = self._table.get(namespace)
        if table is None or table.pop(key, None) is None:
            return False
        if not table:
            del self._table[namespace]
        log.info("kv config %s/%s deleted", namespace, key)
        return True

    def namespace(self, namespace: str) -> dict[str, str]:
        """A copy of one namespace's table (empty when unknown)."""
        return dict(self._table.get(namespace, {}))
