"""`tidemq send` / `tidemq consume` against a real name server + broker."""

from __future__ import annotations

import re

from tests.cli.clirun import SEND_RESULT, tidemq, tidemq_parallel


def consumed(run) -> list[tuple[str, str, str, str]]:
    """(topic, broker/queue@offset, tags, body) per printed message."""
    rows = [tuple(line.split("\t", 3)) for line in run.ok().lines()]
    assert all(len(r) == 4 for r in rows), run.out
    return rows  # type: ignore[return-value]


def consume(cluster, topic: str, group: str, *args: str) -> tuple[str, ...]:
    return ("consume", "-n", cluster.namesrv_addr, "-t", topic, "-g", group, *args)


def test_send_and_consume_round_trip_with_body_from_flag_and_stdin(cluster):
    cluster.create_topic("MsgRound", queues=2)
    r = tidemq("send", "-n", cluster.namesrv_addr, "-t", "MsgRound", "-b", "hello world", "--tags", "TA", "-k", "k1").ok()
    m = SEND_RESULT.search(r.out)
    assert m and m.group(1) == "SEND_OK" and len(m.group(2)) == 32 and len(m.group(3)) == 32, r.out
    body = "piped body \u00e9 (utf-8)"
    tidemq("send", "-n", cluster.namesrv_addr, "-t", "MsgRound", "--tags", "TB", input=body.encode()).ok()

    r = tidemq(*consume(cluster, "MsgRound", "MsgRoundGroup", "--wait", "0.5"))
    rows = consumed(r)
    assert len(rows) == 2, r.out
    assert {(row[0], row[2], row[3]) for row in rows} == {("MsgRound", "TA", "hello world"), ("MsgRound", "TB", body)}
    assert all(row[1].startswith(f"{cluster.broker_name}/") for row in rows)
    assert r.err.strip().splitlines()[-1] == "consumed 2 messages"


def test_tag_expressions_filter_what_is_consumed(cluster):
    cluster.create_topic("MsgTags", queues=2)
    a, b = tidemq_parallel(
        ("send", "-n", cluster.namesrv_addr, "-t", "MsgTags", "-b", "a-body", "--tags", "TagA", "-c", "3"),
        ("send", "-n", cluster.namesrv_addr, "-t", "MsgTags", "-b", "b-body", "--tags", "TagB", "-c", "2"),
    )
    a.ok(), b.ok()
    only_b, a_or_c, everything = tidemq_parallel(
        consume(cluster, "MsgTags", "MsgTagsB", "-s", "TagB", "--wait", "0.5"),
        consume(cluster, "MsgTags", "MsgTagsAC", "-s", "TagA || TagC", "--wait", "0.5"),
        consume(cluster, "MsgTags", "MsgTagsAll", "--wait", "0.5"),
    )
    assert sorted((t, body) for _, _, t, body in consumed(only_b)) == [("TagB", "b-body")] * 2
    assert sorted((t, body) for _, _, t, body in consumed(a_or_c)) == [("TagA", "a-body")] * 3
    assert sorted(t for _, _, t, _ in consumed(everything)) == ["TagA"] * 3 + ["TagB"] * 2


def test_committed_offsets_and_from_beginning(cluster):
    cluster.create_topic("MsgReplay", queues=2)
    tidemq("send", "-n", cluster.namesrv_addr, "-t", "MsgReplay", "-b", "again", "-c", "4").ok()

    first = consumed(tidemq(*consume(cluster, "MsgReplay", "MsgReplayGroup", "-c", "4")))
    assert len(first) == 4
    # the group committed its offsets: nothing new for it ...
    again = tidemq(*consume(cluster, "MsgReplay", "MsgReplayGroup", "--wait", "0.3")).ok()
    assert again.out == "" and again.err.strip().endswith("consumed 0 messages")
    # ... unless it starts over
    replay = consumed(tidemq(*consume(cluster, "MsgReplay", "MsgReplayGroup", "--from-beginning", "--wait", "0.3")))
    assert sorted(pos for _, pos, _, _ in replay) == sorted(pos for _, pos, _, _ in first)


def test_consume_count_stops_early_and_commits_only_what_was_printed(cluster):
    cluster.create_topic("MsgCount", queues=1)
    tidemq("send", "-n", cluster.namesrv_addr, "-t", "MsgCount", "-b", "c", "-c", "5").ok()
    first = consumed(tidemq(*consume(cluster, "MsgCount", "MsgCountGroup", "-c", "2")))
    rest = consumed(tidemq(*consume(cluster, "MsgCount", "MsgCountGroup", "--wait", "0.3")))
    assert [pos for _, pos, _, _ in first] == [f"{cluster.broker_name}/0@{i}" for i in (0, 1)]
    assert [pos for _, pos, _, _ in rest] == [f"{cluster.broker_name}/0@{i}" for i in (2, 3, 4)]


def test_send_count_shows_counts_and_rate(cluster):
    """`send -c N` labelled its progress bare "sending"; it says how many, how big, where, and
    ends with the count, the time and the rate."""
    cluster.create_topic("MsgCount", queues=2)
    r = tidemq("send", "-n", cluster.namesrv_addr, "-t", "MsgCount", "-b", "twelve bytes", "-c", "40").ok()
    assert "sending 40 messages of 12 bytes to MsgCount" in r.err, r.err
    assert re.fullmatch(r"sent 40 messages to MsgCount in \d+\.\d\d s \([\d,]+ msg/s\)", r.out.strip()), r.out
