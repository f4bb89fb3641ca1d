"""The SWITCHOVER header and the replica keys of GET_BROKER_RUNTIME_INFO (issue 17): round trips,
ranges, and arbitrary input never raising anything but ValueError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.broker.ha.coordination import MAX_REPLICAS
from tidemq.remoting import RemotingCommand, RequestCode
from tidemq.remoting.codes import RequestCode as Codes
from tidemq.remoting.headers.replica import (
    MAX_REPLICA_ID,
    SwitchoverHeader,
    decode_switchover_answer,
    decode_switchover_header,
    id_list,
    lag_list,
    parse_id_list,
    parse_lag_list,
)

IDS = st.integers(0, MAX_REPLICA_ID)


def test_the_highest_replica_id_is_the_brokers():
    assert MAX_REPLICA_ID == MAX_REPLICAS - 1


def test_switchover_is_a_tidemq_code_clear_of_rocketmq_and_of_a_java_short():
    assert 9000 <= Codes.SWITCHOVER < 1 << 15 and Codes.GET_BROKER_RUNTIME_INFO == 28


@given(st.text(max_size=40), st.one_of(st.none(), IDS))
def test_the_header_round_trips_through_a_request(name, to):
    cmd = RemotingCommand.request(RequestCode.SWITCHOVER, SwitchoverHeader(name, to).fields())
    assert decode_switchover_header(cmd.ext_fields) == SwitchoverHeader(name, to)


def test_absent_or_minus_one_means_the_best_follower_and_out_of_range_is_refused():
    assert decode_switchover_header({"brokerName": "broker-a"}) == SwitchoverHeader("broker-a", None)
    assert decode_switchover_header({"brokerName": "b", "toReplicaId": "-1"}).to_replica_id is None
    for bad, problem in (("5", "outside 0..4"), ("-2", "outside 0..4"), ("x", "not an integer"),
                         ("99999999999", "out of range")):
        with pytest.raises(ValueError, match=problem) as err:
            decode_switchover_header({"brokerName": "b", "toReplicaId": bad})
        assert "toReplicaId" in str(err.value)
    with pytest.raises(ValueError, match="outside 0..4"):
        SwitchoverHeader("b", 7)


@given(st.dictionaries(st.sampled_from(["brokerName", "toReplicaId", "replicaId"]),
                       st.one_of(st.text(max_size=30), st.integers().map(str))))
def test_any_fields_decode_or_raise_value_error(fields):
    for decode in (decode_switchover_header, decode_switchover_answer):
        try:
            decode(fields)
        except ValueError:
            pass


def test_the_answer_names_a_replica():
    assert decode_switchover_answer({"replicaId": "2"}) == 2
    for bad in ({}, {"replicaId": "9"}, {"replicaId": "-1"}):
        with pytest.raises(ValueError, match="replicaId"):
            decode_switchover_answer(bad)


@given(st.lists(IDS, max_size=5).map(tuple),
       st.lists(st.tuples(IDS, st.integers(0, 1 << 62)), max_size=5).map(tuple))
def test_lists_round_trip(ids, lags):
    assert parse_id_list(id_list(ids)) == ids
    assert parse_lag_list(lag_list(lags)) == lags


def test_list_formats_and_bad_lists():
    assert id_list((0, 1, 2)) == "0,1,2" and lag_list(((1, 0), (2, 4096))) == "1:0,2:4096"
    assert parse_id_list("") == () and parse_lag_list("") == ()
    with pytest.raises(ValueError, match="haInSync"):
        parse_id_list("0,x")
    for bad in ("1", "1:x", "1:2,3"):
        with pytest.raises(ValueError, match="haFollowerLag"):
            parse_lag_list(bad)


@given(st.text(max_size=40))
def test_any_text_parses_or_raises_value_error(text):
    for parse in (parse_id_list, parse_lag_list):
        try:
            parse(text)
        except ValueError:
            pass
