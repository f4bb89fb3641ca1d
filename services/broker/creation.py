"""Implicit creation of subscription groups and topics (a consumer's first heartbeat, pull or
send-back; a first send with auto-creation on), in one place for every request family.

Each creation checks the name with RocketMQ's rules (``validate_group_name``), then the
broker's bounds (:mod:`tidemq.broker.quota`) charged to the requesting principal; the ACL has
already checked that the principal may use the group or topic (tidemq.broker.acl). A refusal
raises the :class:`~tidemq.errors.BrokerError` the request is answered with; nothing is created
then. Lookups of what exists cost one dict lookup (the send and pull paths call these).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.messaging.context import refused
from tidemq.broker.quota import CreationQuota
from tidemq.broker.topics import (
    DLQ_PREFIX,
    RETRY_PREFIX,
    TopicConfig,
    loggable,
    validate_group_name,
)
from tidemq.remoting import ResponseCode
from tidemq.remoting.codes import Perm

if TYPE_CHECKING:
    from tidemq.broker.groups import SubscriptionGroupManager
    from tidemq.broker.topics import TopicConfigManager

log = logging.getLogger(__name__)


class ImplicitCreation:
    def __init__(self, topics: "TopicConfigManager", groups: "SubscriptionGroupManager", quota: CreationQuota,
                 auto_create_group: Callable[[], bool], topics_changed: Callable[[], object]) -> None:
        self.topics = topics
        self.groups = groups
        self.quota = quota
        # Read per creation: UPDATE_BROKER_CONFIG may switch autoCreateSubscriptionGroup.
        self.auto_create_group = auto_create_group
        self.topics_changed = topics_changed

    def group(self, name: str, principal: str,
              invalid_code: int = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST) -> SubscriptionGroupConfig:
        """The group's config, created when the broker auto-creates groups. Raises BrokerError:
        ``invalid_code`` for a name RocketMQ refuses, SUBSCRIPTION_GROUP_NOT_EXIST when it does not
        exist and may not be created, or past a creation limit (quota)."""
        g = self.groups.get(name)
        if g is not None:
            return g
        problem = validate_group_name(name)
        if problem:
            raise refused(invalid_code, problem)
        if not self.auto_create_group():
            raise refused(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{name}] does not exist; create it with "
                f"`tidemq admin updateSubGroup -n NAMESRV_ADDR -c CLUSTER -g {name}`",
            )
        self._admit(principal, "group", len(self.groups.groups), name)
        g = SubscriptionGroupConfig(name)
        self.groups.put(g)
        return g

    def check_group_name(self, name: str, code: int = ResponseCode.SYSTEM_ERROR) -> None:
        """Raise BrokerError(``code``) for a group name RocketMQ refuses (known groups pass)."""
        if name in self.groups.groups:
            return
        problem = validate_group_name(name)
        if problem:
            raise refused(code, problem)

    def retry_topic(self, topic: str, principal: str) -> TopicConfig:
        """The config of a ``%RETRY%``/``%DLQ%`` topic (1 queue, read-write), created and registered
        with the name servers when missing."""
        tc = self.topics.get(topic)
        if tc is not None:
            return tc
        group = topic[len(RETRY_PREFIX):] if topic.startswith(RETRY_PREFIX) else topic[len(DLQ_PREFIX):]
        problem = validate_group_name(group)
        if problem:
            raise refused(ResponseCode.SYSTEM_ERROR, f"{problem} (in topic {loggable(topic)})")
        self._admit(principal, "topic", len(self.topics.topics), topic)
        tc = self.topics.create_retry_or_dlq(topic)
        self.topics_changed()
        return tc

    def topic_from_default(self, topic: str, default: str, queue_nums: int, principal: str) -> TopicConfig | None:
        """Auto-create ``topic`` from ``default`` (TBW102) on a first send; None when the default
        topic does not allow it."""
        tmpl = self.topics.get(default)
        if tmpl is None or not tmpl.perm & Perm.INHERIT:
            return None
        self._admit(principal, "topic", len(self.topics.topics), topic)
        tc = self.topics.create_from_default(topic, default, queue_nums)
        if tc is not None:
            self.topics_changed()
        return tc

    def _admit(self, principal: str, kind: str, current: int, name: str) -> None:
        reason = self.quota.admit(principal, kind, current)
        if reason is None:
            return
        n = sum(self.quota.refused.values())
        if n <= 20 or n % 1000 == 0:
            log.warning("refused to create %s %s for %s: %s (%d refusals so far)", kind, loggable(name),
                        loggable(principal), reason, n)
        code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST if kind == "group" else ResponseCode.TOPIC_NOT_EXIST
        raise refused(code, f"{kind} {loggable(name)} was not created: {reason}")
