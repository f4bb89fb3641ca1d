"""RocketMQ 4.x plain ACL on the broker: accounts from a ``plain_acl.yml``, request signatures and
per-resource permissions (RocketMQ's PlainAccessValidator / PlainPermissionManager, rebuilt).

Invariants:

- ACL off: ``Broker.acl`` is None and dispatch has no ACL hook, so a request pays nothing for it.
  ACL on: *every* request carries ``AccessKey`` and a valid ``Signature``. Nothing skips the
  signature: RocketMQ's ``globalWhiteRemoteAddresses`` (addresses allowed without any
  credentials) is ignored with a warning, and an account's ``whiteRemoteAddress``, which in RocketMQ also skips the signature and
  the permission checks, here only *restricts* where that account may connect from.
- The signature is HMAC-SHA1 (secret key) over the values of every extFields entry but
  ``Signature`` and ``_UNIQUE_KEY_QUERY``, ordered by key, then the body, Base64
  (:func:`tidemq.remoting.acl.signature`). It is computed over the extFields strings exactly as
  the decoder received them, before any processor touches them, and compared with
  :func:`hmac.compare_digest` (RocketMQ uses ``String.equals``).
- A refused request is answered like RocketMQ 4.9.8: the ACL hook throws ``AclException``, which
  ``NettyRemotingAbstract.processRequestCommand`` turns into ``SYSTEM_ERROR`` (1) with the
  exception text, so the remark is ``AclException: <RocketMQ's message>``. A refused oneway request
  gets no answer.
- ``admin: true`` is needed by RocketMQ's five ``Permission.ADMIN_CODE`` requests and by two of
  ours: GET_BROKER_RUNTIME_INFO (RocketMQ leaves it open; it tells a replicated group's roles and
  epochs) and SWITCHOVER (moves a group's master). Which topics
  and groups a request touches follows ``PlainAccessValidator.parse``; beyond 4.9.8 we also check
  SEND_BATCH_MESSAGE (topic PUB), LITE_PULL_MESSAGE (as PULL) and QUERY_CONSUMER_OFFSET (topic and
  group SUB). Groups are keyed by their retry topic ``%RETRY%<group>``, as in RocketMQ.
- Secret keys never reach a log line, a repr or a remark.
- The file is polled for changes (stat + read + parse in a worker thread, so a slow volume never
  stalls the event loop); a bad file on reload keeps the old config and logs an error; a bad file
  at start is a :class:`~tidemq.errors.ConfigError`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntFlag
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from tidemq.broker.topics import is_holding_topic
from tidemq.errors import BrokerError, ConfigError, FrameError
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting import fastjson
from tidemq.remoting.acl import RefusalLog, check_account, loggable, peer_host

if TYPE_CHECKING:
    from tidemq.broker.messaging.context import Caller

log = logging.getLogger(__name__)

RETRY_PREFIX = "%RETRY%"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
MIN_KEY_LENGTH = 7  # RocketMQ: "length should longer than 6"


class Perm(IntFlag):
    """RocketMQ's permission bits (acl/common/Permission.java)."""

    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_PERM_TEXT = {"DENY": Perm.DENY, "PUB": Perm.PUB, "SUB": Perm.SUB,
              "PUB|SUB": Perm.PUB | Perm.SUB, "SUB|PUB": Perm.PUB | Perm.SUB}

# RocketMQ 4.9.8 Permission.ADMIN_CODE, then TideMQ's additions (see the module docstring).
ADMIN_CODES = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC,
    RequestCode.UPDATE_BROKER_CONFIG,
    RequestCode.DELETE_TOPIC_IN_BROKER,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_SUBSCRIPTIONGROUP,
    RequestCode.GET_BROKER_RUNTIME_INFO,
    RequestCode.SWITCHOVER,
})


def parse_perm(text: str, where: str) -> Perm:
    """A granted permission: DENY, PUB, SUB, PUB|SUB (or SUB|PUB). Unknown text is an error
    (RocketMQ silently reads it as DENY)."""
    perm = _PERM_TEXT.get(text.strip().replace(" ", "").upper())
    if perm is None:
        hint = "; ANY is what a request needs, not a grant" if text.strip().upper() == "ANY" else ""
        raise ConfigError(f"{where}: permission {text!r} is not DENY, PUB, SUB or PUB|SUB{hint}")
    return perm


def check_perm(needed: Perm, owned: Perm) -> bool:
    """RocketMQ's Permission.checkPermission: DENY wins; ANY needs PUB or SUB; else any shared bit."""
    if owned & Perm.DENY:
        return False
    if needed & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(needed & owned)


# addresses --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AddressPattern:
    """An account's ``whiteRemoteAddress`` in RocketMQ's forms: ``*``, ``192.168.1.*``,
    ``192.168.1.1-100``, ``192.168.1.{1,2,3}``, ``a,b,c`` (exact addresses), one address."""

    text: str
    any: bool = False
    exact: frozenset[str] = frozenset()
    ranges: tuple[tuple[tuple[int, int], ...], ...] = ()

    @classmethod
    def parse(cls, text: str, where: str) -> "AddressPattern":
        t = text.strip()
        if t in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            return cls(t, any=True)
        if t.endswith("}"):
            head, sep, tail = t.rpartition("{")
            if not sep or not head.endswith((".", ":")):
                raise ConfigError(f"{where}: bad address pattern {text!r}")
            return cls(t, exact=frozenset(_exact(head + x.strip(), where) for x in tail[:-1].split(",")))
        if "," in t:
            return cls(t, exact=frozenset(_exact(x.strip(), where) for x in t.split(",")))
        if "*" in t or "-" in t:
            parts = t.split(".")
            if len(parts) != 4:
                raise ConfigError(f"{where}: bad IPv4 address pattern {text!r}")
            return cls(t, ranges=(tuple(_segment(p, text, where) for p in parts),))
        return cls(t, exact=frozenset({_exact(t, where)}))

    def match(self, host: str) -> bool:
        if self.any or host in self.exact:
            return True
        if not self.ranges:
            return False
        parts = host.split(".")
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            return False
        nums = [int(p) for p in parts]
        return any(all(lo <= n <= hi for n, (lo, hi) in zip(nums, r)) for r in self.ranges)


def _exact(addr: str, where: str) -> str:
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        raise ConfigError(f"{where}: {addr!r} is not an IP address") from None


def _segment(part: str, text: str, where: str) -> tuple[int, int]:
    if part == "*":
        return (0, 255)
    lo, _, hi = part.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise ConfigError(f"{where}: bad IPv4 address pattern {text!r}") from None
    if not 0 <= a <= b <= 255:
        raise ConfigError(f"{where}: bad IPv4 address range {part!r} in {text!r}")
    return (a, b)


# accounts -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    perms: Mapping[str, Perm] = field(default_factory=dict)  # topic, or %RETRY%<group>
    white_remote_address: AddressPattern | None = None


@dataclass(frozen=True, slots=True)
class AclConfig:
    accounts: Mapping[str, Account]
    source: str = ""


_ACCOUNT_KEYS = {"accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                 "defaultGroupPerm", "topicPerms", "groupPerms"}
_TOP_KEYS = {"accounts", "globalWhiteRemoteAddresses", "dataVersion"}


def parse_acl_config(text: str, source: str = "plain_acl.yml") -> AclConfig:
    """Parse a RocketMQ ``plain_acl.yml``. Every scalar is read as a string (YAML would turn
    ``secretKey: 12345678`` into a number and ``0123`` into 83)."""
    try:
        doc = yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as exc:  # never str(exc): PyYAML quotes the line, maybe a secretKey
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: not valid YAML{where}: {getattr(exc, 'problem', None) or 'syntax error'}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping with an 'accounts' list")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        log.warning("%s: ignoring unknown keys %s", source, ", ".join(unknown))
    if doc.get("globalWhiteRemoteAddresses"):
        log.warning(
            "%s: globalWhiteRemoteAddresses is ignored: TideMQ never lets an address skip the "
            "signature check; give those clients an account", source)
    raw = doc.get("accounts") or []
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: 'accounts' must be a list")
    accounts: dict[str, Account] = {}
    for i, item in enumerate(raw):
        acct = _account(item, f"{source}: accounts[{i}]")
        if acct.access_key in accounts:
            raise ConfigError(f"{source}: accounts[{i}]: accessKey {acct.access_key!r} is listed twice")
        accounts[acct.access_key] = acct
    return AclConfig(accounts, source)


def _account(item: object, where: str) -> Account:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected a mapping")
    unknown = sorted(set(item) - _ACCOUNT_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(_ACCOUNT_KEYS))})")
    ak, sk = item.get("accessKey"), item.get("secretKey")
    if not isinstance(ak, str) or len(ak) < MIN_KEY_LENGTH:
        raise ConfigError(f"{where}: accessKey must be a string of at least {MIN_KEY_LENGTH} characters")
    where = f"{where} (accessKey {ak})"
    if not isinstance(sk, str) or len(sk) < MIN_KEY_LENGTH:
        raise ConfigError(f"{where}: secretKey must be a string of at least {MIN_KEY_LENGTH} characters")
    admin = str(item.get("admin") or "false").strip().lower()
    if admin not in ("true", "false"):
        raise ConfigError(f"{where}: admin must be true or false")
    perms: dict[str, Perm] = {}
    for key, is_group in (("topicPerms", False), ("groupPerms", True)):
        entries = item.get(key) or []
        if not isinstance(entries, list):
            raise ConfigError(f"{where}: {key} must be a list of 'name=PERM'")
        for entry in entries:
            name, sep, perm = str(entry).partition("=")
            if not sep or not name.strip() or "=" in perm:
                raise ConfigError(f"{where}: {key} entry {entry!r} is not 'name=PERM' (e.g. topicA=PUB|SUB)")
            res = (RETRY_PREFIX + name.strip()) if is_group else name.strip()
            perms[res] = parse_perm(perm, f"{where}: {key} {name.strip()}")
    white = item.get("whiteRemoteAddress")
    if white is not None and not isinstance(white, str):
        raise ConfigError(f"{where}: whiteRemoteAddress must be a string")
    return Account(
        access_key=ak,
        secret_key=sk,
        admin=admin == "true",
        default_topic_perm=parse_perm(item["defaultTopicPerm"], f"{where}: defaultTopicPerm")
        if item.get("defaultTopicPerm") else Perm.DENY,
        default_group_perm=parse_perm(item["defaultGroupPerm"], f"{where}: defaultGroupPerm")
        if item.get("defaultGroupPerm") else Perm.DENY,
        perms=perms,
        white_remote_address=AddressPattern.parse(white, f"{where}: whiteRemoteAddress")
        if white and white.strip() else None,
    )


def load_acl_file(path: Path) -> AclConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the ACL file {path}: {exc}") from None
    return parse_acl_config(text, str(path))


# requests ---------------------------------------------------------------------------------------
def _group(name: str | None) -> str | None:
    return RETRY_PREFIX + name if name else None


# How each request code the broker serves is checked when ACL is on (tests/broker/test_acl_codes.py
# fails when a served code is missing here). Every request needs a valid signature first.
#   "admin":     the account needs ``admin: true`` (RocketMQ's Permission.ADMIN_CODE)
#   "resources": topics/groups read from the header or body by needed_resources()
#   "stored":    resources read from the header, plus the topic of the stored message the request
#                names by offset, checked by its service (StoredAccess) once it has read it
#   "open: ...": any signed account, with the reason (metadata reads RocketMQ leaves open too)
REQUEST_ACCESS: dict[int, str] = {
    RequestCode.SEND_MESSAGE: "resources",  # topic PUB; %RETRY%<g>: group g SUB
    RequestCode.SEND_MESSAGE_V2: "resources",
    RequestCode.SEND_BATCH_MESSAGE: "resources",
    RequestCode.SEND_REPLY_MESSAGE: "resources",  # topic PUB
    RequestCode.SEND_REPLY_MESSAGE_V2: "resources",
    RequestCode.PULL_MESSAGE: "resources",  # topic SUB, group SUB
    RequestCode.LITE_PULL_MESSAGE: "resources",
    RequestCode.QUERY_MESSAGE: "resources",  # topic SUB
    RequestCode.VIEW_MESSAGE_BY_ID: "stored",  # SUB on the message's topic
    RequestCode.CONSUMER_SEND_MSG_BACK: "stored",  # group SUB, SUB on the message's topic
    RequestCode.END_TRANSACTION: "stored",  # PUB on the half message's topic
    RequestCode.HEART_BEAT: "resources",  # each consumer group SUB, each subscribed topic SUB
    RequestCode.UNREGISTER_CLIENT: "resources",  # consumer group SUB
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: "resources",  # group SUB
    RequestCode.GET_CONSUMER_CONNECTION_LIST: "resources",  # group SUB
    RequestCode.QUERY_CONSUMER_OFFSET: "resources",  # group SUB, topic SUB
    RequestCode.UPDATE_CONSUMER_OFFSET: "resources",
    RequestCode.LOCK_BATCH_MQ: "resources",  # group SUB, each queue's topic SUB
    RequestCode.UNLOCK_BATCH_MQ: "resources",
    RequestCode.GET_CONSUME_STATS: "resources",  # group SUB (and the topic SUB when named)
    RequestCode.UPDATE_AND_CREATE_TOPIC: "admin",
    RequestCode.DELETE_TOPIC_IN_BROKER: "admin",
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: "admin",
    RequestCode.DELETE_SUBSCRIPTIONGROUP: "admin",
    RequestCode.UPDATE_BROKER_CONFIG: "admin",
    RequestCode.GET_BROKER_RUNTIME_INFO: "admin",  # replica roles and epochs (issue 17)
    RequestCode.SWITCHOVER: "admin",  # moves a replicated group's master (issue 17)
    RequestCode.GET_ALL_TOPIC_CONFIG: "open: topic names and queue counts, as RocketMQ (admin tools, operator)",
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: "open: group settings, as RocketMQ (admin tools, operator)",
    RequestCode.GET_ALL_CONSUMER_OFFSET: "open: committed offsets (numbers, no messages), as RocketMQ",
    RequestCode.GET_ALL_DELAY_OFFSET: "open: delivery progress of delayed messages (numbers), as RocketMQ",
    RequestCode.GET_BROKER_CONFIG: "open: settings without secrets, as RocketMQ (admin tools)",
    RequestCode.GET_TOPIC_STATS_INFO: "open: queue offsets of a topic (numbers), as RocketMQ",
    RequestCode.GET_MAX_OFFSET: "open: one queue's offset, as RocketMQ (producers' and consumers' clients)",
    RequestCode.GET_MIN_OFFSET: "open: one queue's offset, as RocketMQ",
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: "open: one queue's offset, as RocketMQ",
    RequestCode.GET_EARLIEST_MSG_STORETIME: "open: one queue's first store time, as RocketMQ",
}

_SENDS = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
          RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2)
_LONG_HEADER_SENDS = (RequestCode.SEND_MESSAGE, RequestCode.SEND_REPLY_MESSAGE)


def _json_body(cmd: RemotingCommand, what: str) -> dict:
    try:
        data = fastjson.loads(cmd.body_bytes() or b"{}")
    except FrameError as exc:
        raise ValueError(f"{what} body is not JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def needed_resources(cmd: RemotingCommand) -> dict[str, Perm]:
    """The topics (by name) and groups (by ``%RETRY%<group>``) a request touches, with the
    permission each needs (RocketMQ's PlainAccessValidator.parse, extended to every request
    family; see REQUEST_ACCESS). Raises ValueError when a body that names resources cannot be
    read."""
    f = cmd.ext_fields
    code = cmd.code
    need: dict[str, Perm] = {}

    def add(resource: str | None, perm: Perm) -> None:
        if resource:
            need[resource] = need.get(resource, Perm(0)) | perm

    if code in _SENDS:
        topic = f.get("topic") if code in _LONG_HEADER_SENDS else f.get("b", f.get("topic"))
        if not topic:
            raise ValueError("the send names no topic")
        if topic.startswith(RETRY_PREFIX):
            # The group is the topic's, never the header's: no header field may skip the check.
            add(topic, Perm.SUB)
        else:
            add(topic, Perm.PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        add(_group(f.get("group")), Perm.SUB)
    elif code in (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE):
        add(f.get("topic"), Perm.SUB)
        add(_group(f.get("consumerGroup")), Perm.SUB)
    elif code == RequestCode.QUERY_MESSAGE:
        add(f.get("topic"), Perm.SUB)
    elif code == RequestCode.HEART_BEAT:
        data = _json_body(cmd, "heartbeat")
        consumers = data.get("consumerDataSet")
        for cd in consumers if isinstance(consumers, list) else ():
            if not isinstance(cd, dict):
                continue
            add(_group(str(cd.get("groupName") or "")), Perm.SUB)
            subs = cd.get("subscriptionDataSet")
            for sd in subs if isinstance(subs, list) else ():
                if isinstance(sd, dict):
                    add(str(sd.get("topic") or ""), Perm.SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                  RequestCode.GET_CONSUMER_CONNECTION_LIST):
        add(_group(f.get("consumerGroup")), Perm.SUB)
    elif code in (RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.QUERY_CONSUMER_OFFSET,
                  RequestCode.GET_CONSUME_STATS):
        add(_group(f.get("consumerGroup")), Perm.SUB)
        add(f.get("topic"), Perm.SUB)
    elif code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        data = _json_body(cmd, "queue lock")
        add(_group(str(data.get("consumerGroup") or "")), Perm.SUB)
        mqs = data.get("mqSet")
        for mq in mqs if isinstance(mqs, list) else ():
            if isinstance(mq, dict):
                add(str(mq.get("topic") or ""), Perm.SUB)
    return need


def stored_message_topics(topic: str, properties: Mapping[str, str]) -> list[str]:
    """The topics a stored message belongs to: its own, or for a message held in a delay, timer
    or transaction topic the one it was sent to (``REAL_TOPIC``), and the one a retried message
    came from (``RETRY_TOPIC``)."""
    real = properties.get("REAL_TOPIC")
    out = [real if real and is_holding_topic(topic) else topic]
    retry = properties.get("RETRY_TOPIC")
    if retry and retry not in out:
        out.append(retry)
    return out


def _printable(resource: str) -> str:
    if resource.startswith(RETRY_PREFIX):
        return f"group:{resource[len(RETRY_PREFIX):]}"
    return f"topic:{resource}"


def authorize(config: AclConfig, cmd: RemotingCommand, host: str) -> tuple[str | None, str | None]:
    """``(access_key, None)`` when ``cmd`` from ``host`` is allowed, else ``(access_key, reason)``
    with RocketMQ 4.9.8's wording where it has one."""
    ak, acct, reason = check_account(config.accounts, cmd, host)
    if acct is None:
        return ak, reason
    try:
        need = needed_resources(cmd)
    except ValueError as exc:
        return ak, str(exc)
    if need.get(TRACE_TOPIC) == Perm.PUB:  # message traces may always be written (as RocketMQ)
        return ak, None
    if cmd.code in ADMIN_CODES and not acct.admin:
        return ak, f"Need admin permission for request code={cmd.code}, but accessKey={ak} is not"
    if not acct.admin:
        held = next((r for r in need if is_holding_topic(r)), None)
        if held is not None:  # it holds other topics' messages: no default permission reaches it
            return ak, f"topic:{held} holds other topics' messages; only admin accounts may use it"
    return ak, missing_permission(acct, need)


def missing_permission(acct: Account, need: Mapping[str, Perm]) -> str | None:
    """RocketMQ's wording for the first resource of ``need`` the account may not use, else None.
    An admin account without per-resource entries may use everything (RocketMQ)."""
    if not need or (acct.admin and not acct.perms):
        return None
    for resource, perm in need.items():
        owned = acct.perms.get(resource)
        if owned is None:
            owned = acct.default_group_perm if resource.startswith(RETRY_PREFIX) else acct.default_topic_perm
        for bit in (Perm.PUB, Perm.SUB):  # a resource needing both needs each
            if perm & bit and not check_perm(bit, owned):
                return f"No default permission for {loggable(_printable(resource))}"
    return None


def _stamp(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)  # follows symlinks: a Kubernetes Secret update swaps ..data, a new inode
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


class AclService:
    """The broker's ACL: the current config, request checks and the reload loop."""

    def __init__(self, path: Path, reload_interval: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.reload_interval = reload_interval
        self.clock = clock
        self._stamp = _stamp_or_none(path)
        self.config = load_acl_file(path)
        self.refused = 0
        self.reloads = 0
        self.reload_errors = 0
        self._refusals = RefusalLog(log, clock=clock)
        log.info("ACL enabled from %s: %d account(s) %s", path, len(self.config.accounts),
                 ", ".join(sorted(self.config.accounts)))

    def check(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """None when allowed; else the refusal to send back (RocketMQ's SYSTEM_ERROR)."""
        ak, reason = authorize(self.config, cmd, peer_host(conn.peer))
        if reason is None:
            return None
        self.refused += 1
        self._refusals.refused(f"request code {cmd.code}", conn.peer, ak, reason)
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"AclException: {reason}")

    def check_stored(self, caller: "Caller", need: Mapping[str, Perm]) -> None:
        """:class:`tidemq.broker.messaging.context.StoredAccess`: raise the refusal when the
        caller's (already verified) account may not use ``need``."""
        ak = caller.access_key or ""
        acct = self.config.accounts.get(ak)
        reason = "No accessKey is configured" if acct is None else missing_permission(acct, need)
        if reason is None:
            return
        self.refused += 1
        self._refusals.refused(f"request code {caller.code}", caller.peer, ak, reason)
        raise BrokerError(f"AclException: {reason}", ResponseCode.SYSTEM_ERROR, f"AclException: {reason}")

    def poll(self) -> AclConfig | None:
        """Blocking (run in a worker thread): the new config when the file changed, else None.
        Raises ConfigError for a bad file."""
        stamp = _stamp_or_none(self.path)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        if stamp is None:
            raise ConfigError(f"the ACL file {self.path} is missing")
        return load_acl_file(self.path)

    async def reload_once(self) -> bool:
        try:
            new = await asyncio.to_thread(self.poll)
        except ConfigError as exc:
            self.reload_errors += 1
            log.error("ACL file changed but cannot be used, keeping the previous accounts: %s", exc)
            return False
        if new is None:
            return False
        self.config = new
        self.reloads += 1
        log.info("ACL reloaded from %s: %d account(s) %s", self.path, len(new.accounts),
                 ", ".join(sorted(new.accounts)))
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.reload_interval)
            try:
                await self.reload_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("ACL reload failed")


def _stamp_or_none(path: Path) -> tuple[int, int, int, int] | None:
    try:
        return _stamp(path)
    except OSError:
        return None
