"""The send header's fast path (small numbers looked up, timestamps parsed without field_int)
gives exactly what field_int gives, value or error, for any field text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.remoting.command import field_int
from tidemq.remoting.headers.send import V2_NAMES, decode_send_header

_INT32, _INT64 = 1 << 31, 1 << 63

numbers = st.one_of(
    st.none(),
    st.just(""),
    st.integers(-2, 1100).map(str),
    st.integers(-(1 << 64), 1 << 64).map(str),
    st.sampled_from([" 5", "+1", "1_0", "0x10", "٣", "-0", "007", "9" * 19, "9" * 25, "true", "\n1"]),
    st.text(max_size=6),
)
flags = st.one_of(st.none(), st.sampled_from(["true", "false", "1", "0", "TRUE", "False", "", "yes"]), st.text(max_size=4))


def reference(f: dict[str, str], v2: bool) -> tuple:
    """The header decoded field by field with field_int, as before the fast path."""
    def get(name: str) -> str | None:
        return f.get(V2_NAMES[name] if v2 else name)

    def flag(v: str | None) -> bool:
        return v is not None and v.lower() in ("true", "1")

    return (
        field_int(get("defaultTopicQueueNums"), "defaultTopicQueueNums", 4),
        field_int(get("queueId"), "queueId", -1, _INT32),
        field_int(get("sysFlag"), "sysFlag", 0, _INT32),
        field_int(get("bornTimestamp"), "bornTimestamp", 0, _INT64),
        field_int(get("flag"), "flag", 0, _INT32),
        field_int(get("reconsumeTimes"), "reconsumeTimes", 0, _INT32),
        flag(get("unitMode")),
        flag(get("batch")),
    )


@settings(max_examples=500)
@given(v2=st.booleans(), qid=numbers, sys_flag=numbers, born=numbers, flag=numbers, reconsume=numbers,
       dqn=numbers, unit_mode=flags, batch=flags)
def test_the_fast_path_matches_field_int(v2, qid, sys_flag, born, flag, reconsume, dqn, unit_mode, batch):
    raw = {"queueId": qid, "sysFlag": sys_flag, "bornTimestamp": born, "flag": flag, "reconsumeTimes": reconsume,
           "defaultTopicQueueNums": dqn, "unitMode": unit_mode, "batch": batch, "topic": "T"}
    fields = {(V2_NAMES[k] if v2 else k): v for k, v in raw.items() if v is not None}
    try:
        want = reference(fields, v2)
    except ValueError as exc:  # the same error, naming the same (first) bad field
        with pytest.raises(ValueError) as got:
            decode_send_header(fields, v2)
        assert str(got.value) == str(exc)
        return
    h = decode_send_header(fields, v2)
    assert (h.default_topic_queue_nums, h.queue_id, h.sys_flag, h.born_timestamp, h.flag, h.reconsume_times,
            h.unit_mode, h.batch) == want
