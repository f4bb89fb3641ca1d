"""Atomic writes leave no temporary file on any path (issue 14: stray ``.topics.json.bak.*.tmp`` of
10-20 MB were found in config/ after a broker hit the open-file limit), and a failed write keeps
the file and its ``.bak`` whole.

Every system call of a write (open, write, fsync, link, rename, the backup copy) is made to fail
in turn with the errors a full disk or an exhausted descriptor table gives; afterwards the
directory holds only the file and its backup, with the contents they had."""

from __future__ import annotations

import errno
import json
import os

import pytest

from tidemq.broker.store import jsonfile
from tidemq.broker.store.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from tidemq.broker.store.jsonfile import read_json, write_json_atomic

EMFILE = OSError(errno.EMFILE, "Too many open files")
ENOSPC = OSError(errno.ENOSPC, "No space left on device")
EIO = OSError(errno.EIO, "Input/output error")


def fail_on(monkeypatch, name: str, exc: BaseException, when=lambda *a: True, after: int = 0) -> list:
    """Make jsonfile.os.<name> raise ``exc`` for calls matching ``when`` once ``after`` matching
    calls went through; returns the list of calls that failed."""
    real = getattr(os, name)
    seen, failed = [0], []

    def fake(*args, **kwargs):
        if when(*args):
            seen[0] += 1
            if seen[0] > after:
                failed.append(args)
                raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(jsonfile.os, name, fake)
    return failed


def is_bak_tmp(*args) -> bool:
    """os.replace(tmp, ...) of the previous version's temp file (.topics.json.bak.<pid>...tmp)."""
    return ".bak." in str(args[0])


def setup(tmp_path):
    p = tmp_path / "config" / "topics.json"
    write_json_atomic(p, {"v": 1})
    write_json_atomic(p, {"v": 2})
    return p


def assert_intact(p, file_v: int, bak_v: set[int]) -> None:
    names = sorted(os.listdir(p.parent))
    assert names == ["topics.json", "topics.json.bak"], names
    assert json.loads(p.read_text()) == {"v": file_v}
    assert json.loads((p.parent / "topics.json.bak").read_text())["v"] in bak_v


CASES = [
    # (system call, error, which calls fail, how many go through first)
    ("link", EMFILE, lambda *a: True, 0),                 # no link: the copy fallback runs...
    ("link", ENOSPC, lambda *a: True, 0),
    ("link", OSError(errno.EPERM, "Operation not permitted"), lambda *a: True, 0),
    ("replace", EIO, is_bak_tmp, 0),                      # linked, the rename to .bak fails
    ("replace", EIO, lambda *a: not is_bak_tmp(*a), 0),   # .bak made, the rename over the file fails
    ("write", ENOSPC, lambda *a: True, 0),                # the new content cannot be written
    ("fsync", EIO, lambda *a: True, 0),
    ("open", EMFILE, lambda *a: True, 0),                 # no descriptor for the temp file
    ("close", EIO, lambda *a: True, 0),
    ("unlink", EIO, lambda *a: True, 0),                  # and the cleanup itself fails
]


@pytest.mark.parametrize("call, exc, when, after", CASES,
                         ids=["link-EMFILE", "link-ENOSPC", "link-EPERM", "replace-bak", "replace-file",
                              "write-ENOSPC", "fsync-EIO", "open-EMFILE", "close-EIO", "unlink-EIO"])
def test_a_failing_write_leaves_no_temp_file(tmp_path, monkeypatch, call, exc, when, after) -> None:
    p = setup(tmp_path)
    if call == "unlink":  # the cleanup fails after the rename failed: the next write removes it
        fail_on(monkeypatch, "replace", EIO, lambda *a: not is_bak_tmp(*a))
    failed = fail_on(monkeypatch, call, exc, when, after)
    try:
        write_json_atomic(p, {"v": 3})
    except OSError:
        pass
    monkeypatch.undo()
    if call != "unlink" and call != "close":
        assert failed, f"os.{call} was never called"
    if call == "unlink":
        write_json_atomic(p, {"v": 4})  # the next write sweeps what the failed cleanup left
        assert_intact(p, 4, {2, 3})
        return
    assert_intact(p, json.loads(p.read_text())["v"], {1, 2})
    assert json.loads(p.read_text())["v"] in (2, 3)


@pytest.mark.parametrize("call, exc", [("link", EMFILE), ("link", ENOSPC)])
def test_the_backup_copy_failing_too_leaves_no_temp_file(tmp_path, monkeypatch, call, exc) -> None:
    """No hard link, and the fallback copy of the previous version fails while writing (a full
    disk): the 10-20 MB ``.topics.json.bak.*.tmp`` copies of the report."""
    p = setup(tmp_path)
    fail_on(monkeypatch, call, exc)
    fail_on(monkeypatch, "write", ENOSPC)
    with pytest.raises(OSError):
        write_json_atomic(p, {"v": 3})
    monkeypatch.undo()
    assert_intact(p, 2, {1})


def test_a_stray_of_a_dead_process_is_removed_by_the_next_write(tmp_path) -> None:
    """A broker killed mid-write (or one that could not start again) leaves a temp file that no
    load removes; the next write of the same file does."""
    p = setup(tmp_path)
    for stray in (".topics.json.99999.1.1.tmp", ".topics.json.bak.99999.1.2.tmp"):
        (p.parent / stray).write_bytes(b"x" * 1024)
    write_json_atomic(p, {"v": 3})
    assert_intact(p, 3, {2})


def test_checkpoint_writes_leave_no_temp_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "checkpoint"
    cp = Checkpoint(1, 2, 3, 100, 90, 80, 64, 17)
    write_checkpoint(path, cp)
    (tmp_path / ".checkpoint.99999.1.1.tmp").write_bytes(b"half")
    fail_on(monkeypatch, "fsync", EIO)
    with pytest.raises(OSError):
        write_checkpoint(path, Checkpoint(9, 9, 9, 9, 9, 9, 9, 9))
    monkeypatch.undo()
    write_checkpoint(path, cp)
    assert os.listdir(tmp_path) == ["checkpoint"] and read_checkpoint(path) == cp


def test_a_write_in_flight_in_another_thread_is_not_swept(tmp_path, monkeypatch) -> None:
    """The sweep removes strays, never the temp file of a write running in this process."""
    p = setup(tmp_path)
    other = p.parent / f".topics.json.{os.getpid()}.7.7.tmp"
    other.write_text("in flight")
    jsonfile._IN_FLIGHT.add(str(other))
    try:
        write_json_atomic(p, {"v": 3})
        assert other.exists()
    finally:
        jsonfile._IN_FLIGHT.discard(str(other))
    assert read_json(p, None) == {"v": 3}
