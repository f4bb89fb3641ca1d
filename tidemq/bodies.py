"""Admin request bodies shared by the broker and the client (pure values, wire names inside)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

_WIRE = {
    "group_name": "groupName",
    "consume_enable": "consumeEnable",
    "consume_from_min_enable": "consumeFromMinEnable",
    "consume_broadcast_enable": "consumeBroadcastEnable",
    "retry_queue_nums": "retryQueueNums",
    "retry_max_times": "retryMaxTimes",
    "broker_id": "brokerId",
    "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
    "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
}


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_json(self) -> dict[str, object]:
        return {_WIRE[k]: v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> "SubscriptionGroupConfig":
        kwargs: dict[str, object] = {}
        defaults = {f.name: f.default for f in fields(cls)}
        for py, wire in _WIRE.items():
            if wire in d and d[wire] is not None:
                default = defaults[py]
                v = d[wire]
                if isinstance(default, bool):
                    v = v if isinstance(v, bool) else str(v).lower() in ("true", "1")
                elif isinstance(default, int):
                    v = int(v)
                else:
                    v = str(v)
                kwargs[py] = v
        if "group_name" not in kwargs:
            raise ValueError("subscription group config has no groupName")
        return cls(**kwargs)  # type: ignore[arg-type]
