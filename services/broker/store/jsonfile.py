"""Small files written atomically: JSON metadata (topics.json, subscriptionGroup.json,
consumerOffset.json, ...) and the store checkpoint.

Invariant: a reader sees either the complete old content or the complete new content, never a
mix: data goes to a temporary file in the same directory, which is fsynced, renamed over the
target, and the directory is fsynced so the rename itself survives a power failure. A crash before
the rename leaves the old file untouched (and at most a stray ``.<name>.<pid>.<thread>.<n>.tmp``, ignored and
replaced by the next write).

These functions block: call them from a worker thread when running on an event loop.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidemq.errors import StoreCorruptError

from tidemq.broker.store.mapped_file import fsync_dir

log = logging.getLogger(__name__)


_SEQ = itertools.count()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{next(_SEQ)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON (or ``str``/``bytes`` already serialised, e.g. fastjson form)."""
    if isinstance(obj, bytes):
        data = obj
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
    else:
        data = json.dumps(obj, ensure_ascii=False, indent=2).encode("utf-8")
    write_bytes_atomic(path, data)


def read_json(path: Path, default: Any, loads: Callable[[str], Any] = json.loads) -> Any:
    """Parse ``path``; ``default`` when it does not exist. Invalid content raises
    StoreCorruptError naming the file (never silently resets metadata). Temporary files
    left by writes a crash interrupted are removed (read at load, before any writer runs)."""
    path = Path(path)
    for stray in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            stray.unlink()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreCorruptError(
            f"{path} is not valid JSON ({exc}); restore it from a backup, or move it away to "
            f"start with empty settings"
        ) from None
