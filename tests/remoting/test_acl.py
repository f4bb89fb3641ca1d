"""ACL request signatures: RocketMQ's rule, and that a configured client signs what it sends."""

from __future__ import annotations

import base64
import hashlib
import hmac

from tidemq.client.config import ClientConfig
from tidemq.client.instance import ClientInstance
from tidemq.remoting import RemotingCommand, RemotingServer, RequestCode
from tidemq.remoting.acl import AclSigner, signature, verify


def test_signature_is_hmac_sha1_of_sorted_values_then_body():
    fields = {"topic": "T", "AccessKey": "ak", "queueId": "3"}
    content = ("ak" + "3" + "T").encode() + b"body"  # AccessKey < queueId < topic
    want = base64.b64encode(hmac.new(b"sk", content, hashlib.sha1).digest()).decode()
    assert signature(fields, b"body", "sk") == want


def test_signer_adds_access_key_and_a_verifiable_signature():
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T", "queueId": 1},
                                  body=[b"he", memoryview(b"llo")])
    AclSigner("ak", "sk")(cmd)
    assert cmd.ext_fields["AccessKey"] == "ak"
    assert verify(cmd, "sk")
    assert not verify(cmd, "other")
    cmd.ext_fields["topic"] = "tampered"
    assert not verify(cmd, "sk")


def test_unsigned_request_does_not_verify():
    assert not verify(RemotingCommand.request(RequestCode.HEART_BEAT), "sk")


def test_a_non_ascii_signature_is_refused_not_an_error():
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T", "Signature": "\u00e9\u2603"}, b"x")
    assert verify(cmd, "secret") is False


async def test_client_with_keys_signs_every_request():
    seen: list[RemotingCommand] = []

    class Handler:
        def handle(self, conn, cmd):
            seen.append(cmd)
            return RemotingCommand.response(0, "", {})

        def connection_lost(self, conn):
            pass

    server = RemotingServer(Handler())
    host, port = await server.start("127.0.0.1", 0)
    inst = ClientInstance(ClientConfig(access_key="ak", secret_key="sk"))
    try:
        await inst.invoke(f"127.0.0.1:{port}",
                          RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                  {"topic": "T", "queueId": 0}))
    finally:
        await inst.remoting.close()
        await server.stop()
    assert len(seen) == 1 and seen[0].ext_fields["AccessKey"] == "ak"
    assert verify(seen[0], "sk")
