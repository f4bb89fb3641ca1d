"""The compiled send and pull header decoders (tidemq/remoting/headers/_headers_c.pyx) against their
Python twins: for any field text (or odd value), equal headers or the same error and message."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tidemq import compiled
from tidemq.remoting.headers import pull, send

_c = compiled.load("tidemq.remoting.headers._headers_c")
pytestmark = pytest.mark.skipif(
    _c is None, reason="the compiled header decoders are not loaded (TIDEMQ_NO_EXTENSIONS=1 or not built)")

numbers = st.one_of(
    st.none(),
    st.just(""),
    st.integers(-2, 1100).map(str),
    st.integers(-(1 << 64), 1 << 64).map(str),
    st.sampled_from([" 5", "+1", "1_0", "0x10", "٣", "-0", "-", "007", "9" * 18, "-" + "9" * 18, "9" * 19,
                     "9" * 25, "true", "\n1", "2147483648", "-2147483648", "-2147483649"]),
    st.text(max_size=6),
)
flags = st.one_of(st.none(), st.sampled_from(["true", "false", "1", "0", "TRUE", "False", "", "yes"]),
                  st.text(max_size=4))
odd = st.one_of(st.integers(-5, 5), st.booleans(), st.floats(allow_nan=False), st.lists(st.integers(), max_size=1))


def _outcome(fn, *args) -> tuple:
    try:
        return (True, fn(*args))
    except Exception as exc:  # noqa: BLE001 (any error must be the twin's error)
        return (False, type(exc), str(exc))


@settings(max_examples=500)
@given(v2=st.booleans(), qid=numbers, sys_flag=numbers, born=numbers, flag=numbers, reconsume=numbers,
       dqn=numbers, unit_mode=flags, batch=flags, max_reconsume=numbers,
       texts=st.lists(st.none() | st.text(max_size=5), min_size=4, max_size=4))
@example(v2=True, qid="1", sys_flag="0", born="1732600000000", flag="0", reconsume="0", dqn="4", unit_mode="false",
         batch="false", max_reconsume=None, texts=["g", "T", "TBW102", "UNIQ_KEY\x017F"])
def test_send_headers_decode_the_same(v2, qid, sys_flag, born, flag, reconsume, dqn, unit_mode, batch,
                                      max_reconsume, texts):
    raw = {"queueId": qid, "sysFlag": sys_flag, "bornTimestamp": born, "flag": flag, "reconsumeTimes": reconsume,
           "defaultTopicQueueNums": dqn, "unitMode": unit_mode, "batch": batch, "maxReconsumeTimes": max_reconsume,
           "producerGroup": texts[0], "topic": texts[1], "defaultTopic": texts[2], "properties": texts[3]}
    fields = {(send.V2_NAMES[k] if v2 else k): v for k, v in raw.items() if v is not None}
    assert _outcome(_c.decode_send_header, fields, v2) == _outcome(send.decode_send_header_py, fields, v2)
    # the other naming: every field missing, defaults (or the twin's error) alike
    assert _outcome(_c.decode_send_header, fields, not v2) == _outcome(send.decode_send_header_py, fields, not v2)


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(list(send.V2_NAMES.values()) + list(send.V2_NAMES)), numbers | odd,
                       max_size=8), st.booleans())
def test_send_headers_with_odd_values_decode_the_same(fields, v2):
    assert _outcome(_c.decode_send_header, fields, v2) == _outcome(send.decode_send_header_py, fields, v2)


@settings(max_examples=500)
@given(st.fixed_dictionaries({}, optional={
    "consumerGroup": st.text(max_size=4), "topic": st.text(max_size=4), "queueId": numbers, "queueOffset": numbers,
    "maxMsgNums": numbers, "sysFlag": numbers, "commitOffset": numbers, "suspendTimeoutMillis": numbers,
    "subscription": st.text(max_size=4), "expressionType": st.text(max_size=4), "subVersion": numbers}))
@example({"consumerGroup": "g", "topic": "T", "queueId": "3", "queueOffset": "123456789", "maxMsgNums": "32",
          "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": "15000", "subscription": "*",
          "expressionType": "TAG", "subVersion": "1732600000000"})
@example({"consumerGroup": "g", "queueId": "1", "queueOffset": "0", "maxMsgNums": "100000"})
def test_pull_headers_decode_the_same(fields):
    fields = {k: v for k, v in fields.items() if v is not None}
    assert _outcome(_c.decode_pull_header, fields) == _outcome(pull.decode_pull_header_py, fields)


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(["consumerGroup", "queueId", "queueOffset", "maxMsgNums", "sysFlag",
                                        "commitOffset", "subVersion"]), numbers | odd, max_size=7))
def test_pull_headers_with_odd_values_decode_the_same(fields):
    assert _outcome(_c.decode_pull_header, fields) == _outcome(pull.decode_pull_header_py, fields)


def test_the_header_modules_run_the_compiled_decoders():
    assert send.decode_send_header is _c.decode_send_header and pull.decode_pull_header is _c.decode_pull_header
