"""tidemq.broker.acl: signatures, the RocketMQ plain_acl.yml format, permissions, reload."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import os

import orjson
import pytest
from click.testing import CliRunner

from tests.support.waiting import wait_until
from tidemq.broker.acl import (
    AclService,
    AddressPattern,
    Perm,
    authorize,
    check_perm,
    needed_resources,
    parse_acl_config,
)
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.broker.hooks import AclHook
from tidemq.broker.store.config import StoreConfig
from tidemq.cli.servers import broker_cmd
from tidemq.errors import ConfigError
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.acl import AclSigner, signature
from tidemq.remoting.frame import decode_json_header

SECRET_ADMIN = "admin-secret-0001"
SECRET_APP = "app-secret-0002"

ACL_YAML = f"""
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: adminKey01
    secretKey: {SECRET_ADMIN}
    admin: true
  - accessKey: appKey0001
    secretKey: {SECRET_APP}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
      - topicP=PUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
  - accessKey: numericKey
    secretKey: 12345678
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
  - accessKey: officeOnly
    secretKey: office-secret
    whiteRemoteAddress: 192.168.1.*
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""


def independent_signature(fields: dict[str, str], body: bytes, secret: str) -> str:
    """RocketMQ's AclUtils.combineRequestContent + AclSigner.calSignature, written out again."""
    content = b""
    for key in sorted(fields):
        if key in ("Signature", "_UNIQUE_KEY_QUERY"):
            continue
        content += fields[key].encode("utf-8")
    mac = hmac.new(secret.encode("utf-8"), content + body, hashlib.sha1)
    return base64.b64encode(mac.digest()).decode()


# signatures -------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, data, hex_digest", [
    # RFC 2202 HMAC-SHA1 test cases 1 and 2 (published vectors): the primitive and encoding.
    ("\x0b" * 20, "Hi There", "b617318655057264e28bc0b6fb378c8ef146be00"),
    ("Jefe", "what do ya want for nothing?", "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"),
])
def test_signature_matches_rfc2202_vectors(key, data, hex_digest):
    expected = base64.b64encode(bytes.fromhex(hex_digest)).decode()
    assert signature({"x": data}, b"", key) == expected
    assert signature({"a": data[:3], "b": data[3:]}, b"", key) == expected  # values joined by key order
    assert signature({"a": data[:3]}, data[3:].encode(), key) == expected  # then the body


GOLDEN_REQUESTS = [
    (RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "topicB", "c": "TBW102", "d": "4", "e": "1",
                                   "f": "0", "g": "1700000000000", "h": "0", "i": "TAGS\x01t\x02",
                                   "j": "0", "k": "false", "m": "false"}, b"hello body"),
    (RequestCode.PULL_MESSAGE, {"consumerGroup": "groupB", "topic": "topicB", "queueId": "3",
                                "queueOffset": "1024", "maxMsgNums": "32", "sysFlag": "2",
                                "commitOffset": "0", "suspendTimeoutMillis": "15000",
                                "subscription": "*", "subVersion": "0"}, b""),
    (RequestCode.HEART_BEAT, {}, b'{"clientID":"c1","consumerDataSet":[],"producerDataSet":[]}'),
    (RequestCode.SEND_MESSAGE, {"topic": "t\u00fcpic-\u6f22\u5b57", "producerGroup": "pg",
                                "_UNIQUE_KEY_QUERY": "true"}, "b\u00f6dy".encode()),
    (RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "t", "queueId": "0",
                                         "OnsChannel": "ALIYUN", "Signature": "stale"}, b"\x00\xff"),
]


@pytest.mark.parametrize("code, fields, body", GOLDEN_REQUESTS)
def test_signer_matches_independent_implementation_and_broker_accepts(code, fields, body):
    cmd = RemotingCommand.request(code, dict(fields), body)
    AclSigner("appKey0001", SECRET_APP)(cmd)
    expected_fields = {k: v for k, v in fields.items() if k != "Signature"}
    expected_fields["AccessKey"] = "appKey0001"
    assert cmd.ext_fields["Signature"] == independent_signature(expected_fields, body, SECRET_APP)
    cfg = parse_acl_config(ACL_YAML)
    ak, reason = authorize(cfg, cmd, "127.0.0.1")
    assert ak == "appKey0001"
    assert reason is None or not reason.startswith("Check signature"), reason


def test_signature_is_checked_over_the_received_strings():
    """Numbers sent as strings like "007" or "1.0" must be verified as sent, never re-formatted."""
    fields = {"AccessKey": "numericKey", "topic": "topicX", "queueId": "007", "weight": "1.0",
              "flag": "TRUE", "maxMsgNums": "32"}
    fields["Signature"] = independent_signature(fields, b"", "12345678")
    header = orjson.dumps({"code": int(RequestCode.QUERY_MESSAGE), "flag": 0, "language": "JAVA",
                           "opaque": 1, "serializeTypeCurrentRPC": "JSON", "version": 395,
                           "extFields": fields})
    cmd = decode_json_header(header)
    cfg = parse_acl_config(ACL_YAML)
    assert authorize(cfg, cmd, "127.0.0.1") == ("numericKey", None)
    cmd.ext_fields["queueId"] = "7"  # what a re-serialisation of the integer would give
    assert authorize(cfg, cmd, "127.0.0.1")[1] == "Check signature failed for accessKey=numericKey"


# configuration ----------------------------------------------------------------------------------
def test_plain_acl_yaml_is_read_like_rocketmq():
    cfg = parse_acl_config(ACL_YAML)
    assert set(cfg.accounts) == {"adminKey01", "appKey0001", "numericKey", "officeOnly"}
    assert cfg.accounts["numericKey"].secret_key == "12345678"  # a string, not a YAML number
    app = cfg.accounts["appKey0001"]
    assert not app.admin and cfg.accounts["adminKey01"].admin
    assert app.default_topic_perm == Perm.DENY and app.default_group_perm == Perm.SUB
    assert app.perms["topicB"] == Perm.PUB | Perm.SUB and app.perms["%RETRY%groupA"] == Perm.DENY
    assert app.white_remote_address is None
    assert cfg.accounts["adminKey01"].default_topic_perm == Perm.DENY  # missing default = DENY
    for acct in cfg.accounts.values():
        assert acct.secret_key not in repr(acct)


_A = "accounts:\n  - accessKey: longenough\n    secretKey: SEKRIT-value\n"


@pytest.mark.parametrize("text, message", [
    ("accounts:\n  - accessKey: short\n    secretKey: SEKRIT-value\n", "accessKey must be"),
    ("accounts:\n  - accessKey: longenough\n    secretKey: SEKRIT\n", "secretKey must be"),
    (_A + "    topicPerms: [t=ALL]\n", "not DENY, PUB"),
    (_A + "    defaultTopicPerm: ANY\n", "not a grant"),
    (_A + "    topicPerms: [justname]\n", "is not 'name=PERM'"),
    (_A + "    defaultTopicperm: PUB\n", "unknown keys defaultTopicperm"),
    (_A + "    admin: yes\n", "admin must be"),
    (_A + "  - accessKey: longenough\n    secretKey: SEKRIT-two\n", "listed twice"),
    (_A + "    whiteRemoteAddress: 10.0.0.300\n", "not an IP address"),
    ("accounts: [\n", "not valid YAML"),
    ("accounts:\n  - accessKey: longenough\n    secretKey: 'SEKRIT-unclosed\n", "not valid YAML at line"),
    ("accounts:\n  - accessKey: longenough\n    secretKey: SEKRIT: x: y\n", "not valid YAML at line"),
    ("- a\n- b\n", "expected a mapping"),
])
def test_bad_acl_files_are_clear_errors(text, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_acl_config(text, "acl.yml")
    assert "SEKRIT" not in str(info.value)  # an error never echoes a secret key


def test_global_white_list_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tidemq.broker.acl"):
        cfg = parse_acl_config(ACL_YAML)
    assert "globalWhiteRemoteAddresses is ignored" in caplog.text
    # an address on RocketMQ's global white list still needs credentials
    cmd = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG)
    assert authorize(cfg, cmd, "10.10.103.7") == (None, "No accessKey is configured")


@pytest.mark.parametrize("pattern, yes, no", [
    ("*", ["1.2.3.4", "::1"], []),
    ("192.168.1.*", ["192.168.1.0", "192.168.1.255"], ["192.168.2.1", "::1"]),
    ("192.168.1.10-20", ["192.168.1.10", "192.168.1.20"], ["192.168.1.9", "192.168.1.21"]),
    ("192.168.*.1-2", ["192.168.7.2"], ["192.168.7.3"]),
    ("192.168.1.{1,3}", ["192.168.1.1", "192.168.1.3"], ["192.168.1.2"]),
    ("10.0.0.1,10.0.0.2", ["10.0.0.2"], ["10.0.0.3"]),
    ("127.0.0.1", ["127.0.0.1"], ["127.0.0.2"]),
])
def test_white_remote_address_patterns(pattern, yes, no):
    p = AddressPattern.parse(pattern, "t")
    assert all(p.match(h) for h in yes) and not any(p.match(h) for h in no)


# permissions ------------------------------------------------------------------------------------
def test_check_perm_is_rocketmq_permission_check():
    assert not check_perm(Perm.PUB, Perm.DENY | Perm.PUB)
    assert check_perm(Perm.ANY, Perm.SUB) and check_perm(Perm.ANY, Perm.PUB)
    assert not check_perm(Perm.ANY, Perm.DENY)
    assert check_perm(Perm.PUB, Perm.PUB | Perm.SUB) and not check_perm(Perm.SUB, Perm.PUB)


def _signed(ak: str, sk: str, code: int, fields: dict | None = None, body: bytes = b"") -> RemotingCommand:
    cmd = RemotingCommand.request(code, fields or {}, body)
    AclSigner(ak, sk)(cmd)
    return cmd


HB = orjson.dumps({"clientID": "c", "consumerDataSet": [{"groupName": "groupB", "subscriptionDataSet": [
    {"topic": "topicC", "subString": "*"}, {"topic": "%RETRY%groupB", "subString": "*"}]}]})
HB_DENIED = orjson.dumps({"clientID": "c", "consumerDataSet": [{"groupName": "groupB", "subscriptionDataSet": [
    {"topic": "topicA", "subString": "*"}]}]})

MATRIX = [
    # (access key, secret, code, fields, body, expected reason or None)
    ("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "topicB", "producerGroup": "p"}, b"x", None),
    ("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE_V2, {"b": "topicP", "a": "p"}, b"x", None),
    ("appKey0001", SECRET_APP, RequestCode.SEND_BATCH_MESSAGE, {"b": "topicC", "a": "p"}, b"x",
     "No default permission for topic:topicC"),
    ("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "topicA"}, b"x", "No default permission for topic:topicA"),
    ("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "other"}, b"x", "No default permission for topic:other"),
    ("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "%RETRY%groupB", "group": "groupB"}, b"x", None),
    ("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "%RETRY%groupA", "group": "groupA"}, b"x",
     "No default permission for group:groupA"),
    ("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "RMQ_SYS_TRACE_TOPIC"}, b"x", None),
    ("appKey0001", SECRET_APP, RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupB"}, b"", None),
    ("appKey0001", SECRET_APP, RequestCode.PULL_MESSAGE, {"topic": "topicP", "consumerGroup": "groupB"}, b"",
     "No default permission for topic:topicP"),
    ("appKey0001", SECRET_APP, RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupA"}, b"",
     "No default permission for group:groupA"),
    ("appKey0001", SECRET_APP, RequestCode.LITE_PULL_MESSAGE, {"topic": "topicP", "consumerGroup": "g"}, b"",
     "No default permission for topic:topicP"),
    ("appKey0001", SECRET_APP, RequestCode.HEART_BEAT, {}, HB, None),
    ("appKey0001", SECRET_APP, RequestCode.HEART_BEAT, {}, HB_DENIED, "No default permission for topic:topicA"),
    ("appKey0001", SECRET_APP, RequestCode.HEART_BEAT, {}, b"{not json", "heartbeat body is not JSON"),
    ("appKey0001", SECRET_APP, RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "groupA", "topic": "topicC"}, b"",
     "No default permission for group:groupA"),
    ("appKey0001", SECRET_APP, RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "groupB"}, b"", None),
    ("appKey0001", SECRET_APP, RequestCode.QUERY_MESSAGE, {"topic": "topicA"}, b"", "No default permission for topic:topicA"),
    ("appKey0001", SECRET_APP, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "groupA"}, b"",
     "No default permission for group:groupA"),
    ("appKey0001", SECRET_APP, RequestCode.GET_ALL_TOPIC_CONFIG, {}, b"", None),  # signature only
    *[("appKey0001", SECRET_APP, code, {"topic": "topicB"}, b"",
       f"Need admin permission for request code={int(code)}, but accessKey=appKey0001 is not")
      for code in (RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG,
                   RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                   RequestCode.DELETE_SUBSCRIPTIONGROUP)],
    ("adminKey01", SECRET_ADMIN, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "x"}, b"", None),
    ("adminKey01", SECRET_ADMIN, RequestCode.SEND_MESSAGE, {"topic": "anything"}, b"x", None),  # admin, no perms listed
    ("appKey0001", "wrong-secret", RequestCode.SEND_MESSAGE, {"topic": "topicB"}, b"x",
     "Check signature failed for accessKey=appKey0001"),
    ("nobody0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "topicB"}, b"x", "No acl config for nobody0001"),
    ("officeOnly", "office-secret", RequestCode.SEND_MESSAGE, {"topic": "t"}, b"x",
     "Remote address 127.0.0.1 is not in the whiteRemoteAddress of accessKey=officeOnly"),
]


@pytest.mark.parametrize("ak, sk, code, fields, body, expected", MATRIX)
def test_permission_matrix(ak, sk, code, fields, body, expected):
    cfg = parse_acl_config(ACL_YAML)
    got_ak, reason = authorize(cfg, _signed(ak, sk, code, fields, body), "127.0.0.1")
    assert got_ak == ak
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(expected)


def test_white_address_restricts_but_never_replaces_the_signature():
    cfg = parse_acl_config(ACL_YAML)
    ok = _signed("officeOnly", "office-secret", RequestCode.SEND_MESSAGE, {"topic": "t"}, b"x")
    assert authorize(cfg, ok, "192.168.1.20") == ("officeOnly", None)
    bad = _signed("officeOnly", "not-the-secret", RequestCode.SEND_MESSAGE, {"topic": "t"}, b"x")
    assert authorize(cfg, bad, "192.168.1.20")[1] == "Check signature failed for accessKey=officeOnly"


def test_tampered_body_or_field_fails_and_unsigned_fails():
    cfg = parse_acl_config(ACL_YAML)
    cmd = _signed("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "topicB"}, b"body")
    cmd.body = b"bodY"
    assert authorize(cfg, cmd, "127.0.0.1")[1].startswith("Check signature failed")
    cmd = _signed("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "topicB"}, b"body")
    cmd.ext_fields["topic"] = "topicA"
    assert authorize(cfg, cmd, "127.0.0.1")[1].startswith("Check signature failed")
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "topicB", "AccessKey": "appKey0001"}, b"x")
    assert authorize(cfg, cmd, "127.0.0.1")[1].startswith("Check signature failed")
    cmd.ext_fields["Signature"] = "\u00e9" * 28  # non-ASCII garbage must not crash compare_digest
    assert authorize(cfg, cmd, "127.0.0.1")[1].startswith("Check signature failed")


def test_needed_resources_follow_rocketmq_parse():
    cmd = RemotingCommand.request(RequestCode.HEART_BEAT, {}, HB)
    assert needed_resources(cmd) == {"%RETRY%groupB": Perm.SUB, "topicC": Perm.SUB}
    cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, {"producerGroup": "p"})
    assert needed_resources(cmd) == {}


# the service: answers, logging, reload ------------------------------------------------------------
class _Conn:
    peer = "127.0.0.1:50000"


def test_refusal_is_system_error_with_the_exception_text_and_no_secret(tmp_path, caplog):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    acl = AclService(path)
    with caplog.at_level(logging.DEBUG, logger="tidemq.broker.acl"):
        wrong = _signed("appKey0001", "guessed-secret", RequestCode.SEND_MESSAGE, {"topic": "topicB"}, b"x")
        resp = acl.check(_Conn(), wrong)
        assert resp.code == ResponseCode.SYSTEM_ERROR and resp.opaque == wrong.opaque
        assert resp.remark == "AclException: Check signature failed for accessKey=appKey0001"
        good = _signed("appKey0001", SECRET_APP, RequestCode.SEND_MESSAGE, {"topic": "topicB"}, b"x")
        assert acl.check(_Conn(), good) is None
    assert acl.refused == 1
    assert "accessKey=appKey0001" in caplog.text
    for secret in (SECRET_APP, SECRET_ADMIN, "guessed-secret", "12345678"):
        assert secret not in caplog.text


def test_bad_file_at_start_is_a_config_error(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text("accounts:\n  - accessKey: x\n")
    with pytest.raises(ConfigError, match="accessKey must be"):
        AclService(path)
    with pytest.raises(ConfigError, match="cannot read the ACL file"):
        AclService(tmp_path / "missing.yml")


async def test_reload_on_change_keeps_old_config_on_a_bad_file(tmp_path, caplog):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    acl = AclService(path, reload_interval=0.05)
    new_key = "accounts:\n  - accessKey: newKey0001\n    secretKey: new-secret-1\n    admin: true\n"

    assert await acl.reload_once() is False  # unchanged
    path.write_text(new_key)
    os.utime(path, ns=(1, 1))  # a distinct stamp even on coarse-mtime file systems
    assert await acl.reload_once() is True
    assert set(acl.config.accounts) == {"newKey0001"}
    with caplog.at_level(logging.ERROR, logger="tidemq.broker.acl"):
        path.write_text("accounts:\n  - accessKey: newKey0001\n    secretKey: new-secret-1\n    admin: maybe\n")
        os.utime(path, ns=(2, 2))
        assert await acl.reload_once() is False
        path.unlink()
        assert await acl.reload_once() is False
    assert set(acl.config.accounts) == {"newKey0001"}  # the previous good config stays
    assert "keeping the previous accounts" in caplog.text and "new-secret-1" not in caplog.text
    # Kubernetes Secret volumes swap a symlink: the watch loop picks the new target up
    target = tmp_path / "v2.yml"
    target.write_text(ACL_YAML)
    path.symlink_to(target)
    task = asyncio.create_task(acl.watch())
    try:
        await wait_until(lambda: "appKey0001" in acl.config.accounts,
                         "the ACL watch loop to load the swapped symlink's target", timeout=2, interval=0.02)
    finally:
        task.cancel()
    assert "appKey0001" in acl.config.accounts and acl.reloads == 2


def test_acl_off_runs_no_acl_code(tmp_path):
    """With ACL off the broker's dispatch has no ACL hook: no ACL code runs per request."""
    broker = Broker(BrokerConfig(store=StoreConfig(root=tmp_path / "store")))
    assert broker.acl is None
    assert not [h for h in broker.dispatcher.hooks if isinstance(h, AclHook)]


def test_acl_file_flag_reaches_the_broker_config(tmp_path):
    bad = tmp_path / "acl.yml"
    bad.write_text("accounts:\n  - accessKey: tiny\n")
    r = CliRunner().invoke(broker_cmd, ["--acl-file", str(bad), "--store", str(tmp_path / "s"),
                                        "--listen", "127.0.0.1:0", "--namesrv", "127.0.0.1:1"])
    assert r.exit_code == 1 and "accessKey must be" in r.output, r.output
