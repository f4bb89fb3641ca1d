"""The TideMQ message store (RocketMQ 4.x-style CommitLog, ConsumeQueue, IndexFile).

The public surface is re-exported here; everything else in the package is internal.
"""

from tidemq.broker.store.config import FlushMode, StoreConfig
from tidemq.broker.store.jsonfile import read_json, write_json_atomic
from tidemq.broker.store.store import GetResult, GetStatus, MessageStore, PutRequest, PutResult, PutStatus

__all__ = [
    "FlushMode",
    "GetResult",
    "GetStatus",
    "MessageStore",
    "PutRequest",
    "PutResult",
    "PutStatus",
    "StoreConfig",
    "read_json",
    "write_json_atomic",
]
