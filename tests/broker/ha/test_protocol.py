"""The replication wire codec: round trips, and random bytes raise only ReplicationCodecError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.broker.ha import protocol as p

i64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(max_size=40).filter(lambda s: len(s.encode()) <= p.MAX_NAME)


def records(sizes: list[int]) -> bytes:
    return b"".join(struct.pack(">i", n) + bytes(n - 4) for n in sizes)


frames = st.one_of(
    st.builds(p.Handshake, names, names, st.integers(0, 255), i64, i64),
    st.builds(p.Welcome, i64, i64, i64),
    st.builds(p.Data, i64, st.integers(0, 2**63 - 1),
              st.lists(st.integers(4, 300), min_size=1, max_size=5).map(records)),
    st.builds(p.Ack, i64),
    st.builds(p.Heartbeat, i64, i64),
    st.builds(p.Refusal, st.text(alphabet=st.characters(max_codepoint=127), max_size=200)),
)


@given(frames)
def test_every_frame_round_trips(frame: p.Frame) -> None:
    assert p.decode(p.encode(frame)) == frame


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_the_codec_error(buf: bytes) -> None:
    try:
        p.decode(buf)
    except p.ReplicationCodecError:
        pass


@given(st.sampled_from(list(p.FrameKind)), st.binary(max_size=120))
def test_random_bodies_raise_only_the_codec_error(kind: p.FrameKind, body: bytes) -> None:
    try:
        p.decode_body(kind, body)
    except p.ReplicationCodecError:
        pass


def test_a_length_past_the_limit_is_refused_from_the_head_alone() -> None:
    head = p.FRAME_HEAD.pack(p.MAX_FRAME_BODY + 1, p.FrameKind.DATA)
    with pytest.raises(p.ReplicationCodecError, match="outside"):
        p.decode_head(head)


def test_a_data_frame_with_a_cut_record_is_refused() -> None:
    cut = p.encode(p.Data(1, 0, records([100, 120])[:-10]))
    with pytest.raises(p.ReplicationCodecError, match="does not fit"):
        p.decode(cut)


def test_a_data_frame_whose_records_changed_fails_its_crc() -> None:
    raw = bytearray(p.encode(p.Data(1, 0, records([100, 120]))))
    raw[-1] ^= 0x01
    with pytest.raises(p.ReplicationCodecError, match="CRC"):
        p.decode(bytes(raw))


def test_a_handshake_from_something_else_is_refused_by_its_magic() -> None:
    raw = bytearray(p.encode(p.Handshake("c", "broker-a", 1, 3, 100)))
    raw[p.FRAME_HEAD.size] ^= 0xFF
    with pytest.raises(p.ReplicationCodecError, match="magic"):
        p.decode(bytes(raw))


def test_ha_port_is_the_listen_port_plus_one_as_in_rocketmq() -> None:
    assert p.default_ha_port(10911) == 10912
