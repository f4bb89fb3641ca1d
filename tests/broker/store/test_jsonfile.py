"""Atomic JSON files and the checkpoint codec."""

from __future__ import annotations

import json
import os

import pytest

from tidemq.errors import StoreCorruptError

from tidemq.broker.store import jsonfile
from tidemq.broker.store.checkpoint import (
    Checkpoint,
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from tidemq.broker.store.jsonfile import read_json, write_json_atomic


def test_json_round_trip_and_default(tmp_path):
    p = tmp_path / "config" / "topics.json"
    assert read_json(p, {"empty": True}) == {"empty": True}
    write_json_atomic(p, {"topicConfigTable": {"T": {"readQueueNums": 8}}, "中文": 1})
    assert read_json(p, None) == {"topicConfigTable": {"T": {"readQueueNums": 8}}, "中文": 1}
    write_json_atomic(p, '{"offsetTable":{"T@g":{0:5}}}')  # pre-serialised (fastjson form)
    assert p.read_text() == '{"offsetTable":{"T@g":{0:5}}}'
    assert read_json(p, None, loads=lambda s: s.upper()) == '{"OFFSETTABLE":{"T@G":{0:5}}}'


def test_invalid_json_names_the_file(tmp_path):
    p = tmp_path / "subscriptionGroup.json"
    p.write_text('{"subscriptionGroupTable": {')
    with pytest.raises(StoreCorruptError, match="subscriptionGroup.json"):
        read_json(p, {})
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(StoreCorruptError, match="backup"):
        read_json(p, {})


def test_a_crash_before_the_rename_leaves_the_old_content(tmp_path, monkeypatch):
    p = tmp_path / "consumerOffset.json"
    write_json_atomic(p, {"v": 1})

    def crash(src, dst):
        raise OSError("power lost before rename")

    monkeypatch.setattr(jsonfile.os, "replace", crash)
    with pytest.raises(OSError, match="power lost"):
        write_json_atomic(p, {"v": 2})
    monkeypatch.undo()
    assert read_json(p, None) == {"v": 1}
    assert os.listdir(tmp_path) == ["consumerOffset.json"]  # temp file cleaned up


def test_a_stray_temp_file_is_ignored_and_replaced(tmp_path):
    p = tmp_path / "topics.json"
    write_json_atomic(p, {"v": 1})
    (tmp_path / f".topics.json.{os.getpid()}.1.2.tmp").write_text('{"v": 2, "half')  # killed mid-write
    assert read_json(p, None) == {"v": 1}  # and the stray is cleaned up
    write_json_atomic(p, {"v": 3})
    assert read_json(p, None) == {"v": 3}
    assert sorted(os.listdir(tmp_path)) == ["topics.json", "topics.json.bak"]
    assert (tmp_path / "topics.json.bak").read_text() == '{\n  "v": 1\n}'


@pytest.mark.parametrize("links", [True, False])
def test_a_damaged_or_missing_file_falls_back_to_the_previous_version(tmp_path, monkeypatch, caplog, links):
    """RocketMQ's ConfigManager keeps <file>.bak; so do we: a file damaged on disk (or deleted)
    loads the version before its last write, with a warning saying so."""
    if not links:  # a filesystem without hard links: the previous version is copied
        def no_link(src, dst):
            raise PermissionError(1, "Operation not permitted")
        monkeypatch.setattr(jsonfile.os, "link", no_link)
    p = tmp_path / "consumerOffset.json"
    write_json_atomic(p, {"v": 1})
    assert not (tmp_path / "consumerOffset.json.bak").exists()  # nothing before the first write
    write_json_atomic(p, {"v": 2})
    write_json_atomic(p, {"v": 3})
    assert read_json(p, None) == {"v": 3}
    p.write_text('{"v": 3, "offsetTa')  # damaged
    with caplog.at_level("WARNING"):
        assert read_json(p, None) == {"v": 2}
    assert "consumerOffset.json.bak" in caplog.text and "lost" in caplog.text
    # the damaged file is kept aside, so the next write keeps the good copy as .bak
    assert not p.exists() and (tmp_path / "consumerOffset.json.corrupt").read_text() == '{"v": 3, "offsetTa'
    write_json_atomic(p, {"v": 4})
    assert json.loads((tmp_path / "consumerOffset.json.bak").read_text()) == {"v": 2}  # the good copy stayed
    p.unlink()
    (tmp_path / "consumerOffset.json.corrupt").unlink()
    assert read_json(p, None) == {"v": 2}
    (tmp_path / "consumerOffset.json.bak").write_text("{broken")
    with pytest.raises(StoreCorruptError, match="consumerOffset.json is missing, and its backup is unusable too"):
        read_json(p, None)
    p.write_text("[1,")
    with pytest.raises(StoreCorruptError, match=r"not valid JSON .*and its backup is unusable too.*consumerOffset.json.bak"):
        read_json(p, None)
    assert sorted(os.listdir(tmp_path)) == ["consumerOffset.json", "consumerOffset.json.bak"]


def test_checkpoint_round_trip_and_damage(tmp_path):
    cp = Checkpoint(1, 2, 3, 100, 90, 80, 64, 17)
    data = encode_checkpoint(cp)
    assert len(data) == 4096 and decode_checkpoint(data) == cp
    assert data[:24] == (1).to_bytes(8, "big") + (2).to_bytes(8, "big") + (3).to_bytes(8, "big")
    damaged = data[:40] + b"\x01" + data[41:]
    assert decode_checkpoint(damaged) is None
    path = tmp_path / "checkpoint"
    assert read_checkpoint(path) is None
    write_checkpoint(path, cp)
    assert read_checkpoint(path) == cp
    path.write_bytes(damaged)
    assert read_checkpoint(path) is None



def test_no_backup_fallback_where_an_older_version_is_wrong(tmp_path):
    """The deleted-topics record reads with backup=False: an older version would resurrect a
    deleted topic's messages, so damage refuses and a missing file is the default."""
    p = tmp_path / "deletedTopics.json"
    write_json_atomic(p, {"A": 1})
    write_json_atomic(p, {"A": 1, "B": 2})
    p.write_text("{")
    with pytest.raises(StoreCorruptError, match="deletedTopics.json is not valid JSON"):
        read_json(p, {}, backup=False)
    p.unlink()
    assert read_json(p, {}, backup=False) == {} and read_json(p, {}) == {"A": 1}
