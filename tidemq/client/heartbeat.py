"""HEART_BEAT (34) bodies, Java's shape (enum names, not the cpp client's ordinals).

Pure. A client sends one body listing every producer group and consumer group it hosts; brokers
learn group membership and subscriptions from it (GET_CONSUMER_LIST_BY_GROUP, consumer progress).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from tidemq.client.pull import normalize_expression, parse_tag_expression
from tidemq.message import java_hash
from tidemq.remoting import RemotingCommand, RequestCode

CONSUME_ACTIVELY = "CONSUME_ACTIVELY"
CONSUME_PASSIVELY = "CONSUME_PASSIVELY"
CLUSTERING = "CLUSTERING"
BROADCASTING = "BROADCASTING"
CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"


@dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    expression: str = "*"
    sub_version: int = 0

    def as_json(self) -> dict[str, object]:
        tags = parse_tag_expression(self.expression)
        tag_list = sorted(tags) if tags else []
        return {
            "classFilterMode": False,
            "topic": self.topic,
            "subString": normalize_expression(self.expression),
            "tagsSet": tag_list,
            "codeSet": [java_hash(t) for t in tag_list],
            "subVersion": self.sub_version,
            "expressionType": "TAG",
        }


@dataclass(frozen=True, slots=True)
class ConsumerData:
    group: str
    subscriptions: tuple[Subscription, ...]
    consume_type: str = CONSUME_ACTIVELY
    message_model: str = CLUSTERING
    consume_from_where: str = CONSUME_FROM_LAST_OFFSET

    def as_json(self) -> dict[str, object]:
        return {
            "groupName": self.group,
            "consumeType": self.consume_type,
            "messageModel": self.message_model,
            "consumeFromWhere": self.consume_from_where,
            "unitMode": False,
            "subscriptionDataSet": [s.as_json() for s in self.subscriptions],
        }


def heartbeat_body(
    client_id: str, producer_groups: list[str], consumers: list[ConsumerData]
) -> bytes:
    return orjson.dumps(
        {
            "clientID": client_id,
            "producerDataSet": [{"groupName": g} for g in producer_groups],
            "consumerDataSet": [c.as_json() for c in consumers],
        }
    )


def build_heartbeat(
    client_id: str, producer_groups: list[str], consumers: list[ConsumerData]
) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.HEART_BEAT, None, heartbeat_body(client_id, producer_groups, consumers)
    )


def build_unregister(client_id: str, producer_group: str | None = None,
                     consumer_group: str | None = None) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.UNREGISTER_CLIENT,
        {"clientID": client_id, "producerGroup": producer_group, "consumerGroup": consumer_group},
    )
