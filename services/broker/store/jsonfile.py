"""Small files written atomically: JSON metadata (topics.json, subscriptionGroup.json,
consumerOffset.json, ...) and the store checkpoint.

Invariant: a reader sees either the complete old content or the complete new content, never a
mix: data goes to a temporary file in the same directory, which is fsynced, renamed over the
target, and the directory is fsynced so the rename itself survives a power failure. A crash before
the rename leaves the old file untouched.

Temporary files (``.<name>.<pid>.<thread>.<n>.tmp``) never outlive a write: every failure path
(open, write, fsync, close, link, rename, the backup copy) removes the one it made, and every
successful write of a file, as well as its load, removes the strays of that file (and of its
``.bak``) that no write in this process is still using: those a killed process left, or whose
removal failed (logged). So a broker that hit the open-file limit or a full disk does not pile up
copies of its metadata in config/.

JSON metadata also keeps the previous version as ``<name>.bak`` (RocketMQ's ConfigManager does the
same): before the new content is renamed over the file, the current file is hard-linked to
``.bak`` (copied where links are not supported), so at every moment the file is whole and the
``.bak`` holds the version before it. A file that is missing or not valid JSON at load falls back
to its ``.bak`` with a warning that says what is lost (the changes of its last write), the damaged
file moved to ``<name>.corrupt`` (so the next write does not make it the ``.bak``); when both are
unusable the load refuses, naming both.

These functions block: call them from a worker thread when running on an event loop.
"""

from __future__ import annotations

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
# Temporary files of writes running in this process (any thread): the sweep leaves them alone.
_IN_FLIGHT: set[str] = set()
_IN_FLIGHT_LOCK = threading.Lock()


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{next(_SEQ)}.tmp")


def _remove(tmp: Path) -> None:
    """Remove a temporary file this process made (gone already is fine); a failure is logged and
    left to the next sweep."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove the temporary file %s (the next write of it retries): %s", tmp, exc)
    finally:
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.discard(str(tmp))


def _claim(tmp: Path) -> None:
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.add(str(tmp))


def sweep_strays(path: Path) -> int:
    """Remove the temporary files of ``path`` and of its ``.bak`` that no write in this process is
    using (left by a killed process or a failed removal); return how many."""
    path = Path(path)
    prefixes = (f".{path.name}.", f".{backup_path(path).name}.")
    removed = 0
    try:
        entries = list(os.scandir(path.parent))
    except OSError as exc:  # e.g. no descriptor left: the next write tries again
        log.debug("cannot list %s for stray temporary files: %s", path.parent, exc)
        return 0
    for entry in entries:
        if not (entry.name.startswith(prefixes) and entry.name.endswith(".tmp")):
            continue
        with _IN_FLIGHT_LOCK:
            if entry.path in _IN_FLIGHT:
                continue
        try:
            os.unlink(entry.path)
            removed += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove the stray temporary file %s: %s", entry.path, exc)
    if removed:
        log.info("removed %d stray temporary file(s) of %s", removed, path)
    return removed


def _write_temp(tmp: Path, data: bytes) -> None:
    """Create ``tmp`` with ``data``, fsynced. On any failure ``tmp`` is removed."""
    _claim(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except BaseException:
        _remove(tmp)
        raise
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _remove(tmp)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path)
    _write_temp(tmp, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.discard(str(tmp))
    fsync_dir(path.parent)
    sweep_strays(path)


def backup_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".bak")


def _keep_previous(path: Path) -> None:
    """Make ``<path>.bak`` the current content of ``path`` (atomically; nothing when absent).
    On failure no temporary file is left and the old ``.bak`` is whole."""
    bak = backup_path(path)
    tmp = _temp_name(bak)
    _claim(tmp)
    try:
        os.link(path, tmp)
    except FileNotFoundError:
        _remove(tmp)
        return
    except OSError:  # no hard links here (some network and FUSE filesystems), EMLINK ...: copy
        _remove(tmp)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        write_bytes_atomic(bak, data)
        return
    except BaseException:
        _remove(tmp)
        raise
    try:
        os.replace(tmp, bak)
    except BaseException:
        _remove(tmp)
        raise
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.discard(str(tmp))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON (or ``str``/``bytes`` already serialised, e.g. fastjson form),
    keeping the previous content as ``<path>.bak``."""
    if isinstance(obj, bytes):
        data = obj
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
    else:
        data = json.dumps(obj, ensure_ascii=False, indent=2).encode("utf-8")
    path = Path(path)
    _keep_previous(path)
    write_bytes_atomic(path, data)


_MISSING = object()


def _parse(path: Path, loads: Callable[[str], Any]) -> Any:
    """The parsed content, _MISSING when absent; ValueError (with the reason) when invalid."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return _MISSING
    try:
        return loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None


def read_json(path: Path, default: Any, loads: Callable[[str], Any] = json.loads, backup: bool = True) -> Any:
    """Parse ``path``; ``default`` when neither it nor its ``.bak`` exists. A missing or invalid
    file falls back to ``.bak`` (logged as a warning: its last write is lost); invalid content
    without a usable ``.bak`` raises StoreCorruptError naming the files (never silently resets
    metadata). ``backup=False`` for files where the previous version is wrong rather than stale
    (the deleted-topics record: an older one would resurrect a deleted topic's messages).
    Temporary files left by writes a crash interrupted are removed."""
    path = Path(path)
    bak = backup_path(path)
    sweep_strays(path)
    try:
        data = _parse(path, loads)
        if data is not _MISSING:
            return data
        problem = f"{path} is missing"
    except ValueError as exc:
        if not backup:
            raise StoreCorruptError(f"{exc}; restore it from a backup") from None
        problem = str(exc)
    if not backup:
        return default
    try:
        previous = _parse(bak, loads)
    except ValueError as exc:
        raise StoreCorruptError(
            f"{problem}, and its backup is unusable too ({exc}); restore {path.name} from a backup, or move both "
            f"away to start with empty settings"
        ) from None
    if previous is _MISSING:
        if problem.endswith("is missing"):
            return default
        raise StoreCorruptError(
            f"{problem}, and there is no {bak.name}; restore it from a backup, or move it away to "
            f"start with empty settings"
        )
    if path.exists():  # keep the damaged file for inspection, out of the way of the next write,
        corrupt = path.with_name(path.name + ".corrupt")  # which would make it the next .bak
        os.replace(path, corrupt)
        fsync_dir(path.parent)
        problem += f" (moved to {corrupt.name})"
    log.warning("%s; loaded the previous version from %s instead (changes of the last write of %s are "
                "lost)", problem, bak, path.name)
    return previous
