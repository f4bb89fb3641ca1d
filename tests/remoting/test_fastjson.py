"""fastjson compatibility: unquoted integer keys, inline object keys, and only FrameError on junk."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import FrameError
from tidemq.remoting import fastjson
from tidemq.remoting.fastjson import ObjectKey


def test_unquoted_integer_keys():
    assert fastjson.loads(b'{"brokerAddrs":{0:"a:1",1:"b:2"}}') == {"brokerAddrs": {0: "a:1", 1: "b:2"}}


def test_object_keys_round_trip_in_fastjson_form():
    table = {"offsetTable": {ObjectKey.of(brokerName="b", queueId=0, topic="T"): {"maxOffset": 5}}}
    text = fastjson.dumps(table)
    assert text == b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"maxOffset":5}}}'
    assert fastjson.loads(text) == table


def test_nested_object_keys_are_hashable():
    out = fastjson.loads(b'{{"a":{"x":[1,2]}}:1}')
    (key,) = out
    assert dict(key)["a"] == ObjectKey([("x", (1, 2))])


@settings(max_examples=300)
@given(st.text(alphabet='{}[]:,"0123456789abtruefalsn \\', max_size=60))
def test_junk_raises_only_frame_error(text):
    try:
        fastjson.loads(text)
    except FrameError:
        pass
