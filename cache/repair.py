"""What `verify` and `clear` do to the files of a cache directory, beside its database.

A cache directory holds its database (`cache.db` and SQLite's `-wal` and `-shm`
files), databases moved aside, build locks, prepared bundles and copies of loaded ones, and, where an older
release shares it, that release's value files (`ab/cd/<hex>.val`); `verify` removes
anything else and stale lock files, `clear` everything.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Collection
from pathlib import Path

from portkern.base.records import record
from portkern.cache.entry import Entry
from portkern.cache.layout import BUNDLES, DAMAGED, DATABASE, DATABASE_FILES, LOCKS, PARAMETERS


@record
class Finding:
    """One inconsistency `verify` found and removed (or repaired), or, when `fixed` is false, what
    it found but could not remove or could not check (a read-only or unusable directory)."""

    #: "entry", "record", "file", "lock" or "totals".
    kind: str
    #: The entry key, record name or path (relative to the cache directory).
    name: str
    problem: str
    entry: Entry | None = None
    fixed: bool = True


def stray_files(directory: Path, keep: Collection[str] = ()) -> list[str]:
    """The names in the directory that are not part of the cache (what `verify` removes); `keep`:
    further names that are (the folders of an older release's value files)."""
    return [name for name in sorted(os.listdir(directory))
            if name not in (*DATABASE_FILES, LOCKS, BUNDLES, PARAMETERS, *keep) and not name.startswith(DAMAGED)]


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        import shutil  # (loaded by what removes, not by the warm path's import of this module)

        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def stale_locks(directory: Path) -> list[str]:
    """Remove lock files that no process holds; their relative paths."""
    from filelock import FileLock, Timeout

    removed: list[str] = []
    locks = directory / LOCKS
    if not locks.is_dir():
        return removed
    for path in sorted(locks.iterdir()):
        lock = FileLock(str(path), timeout=0)
        try:
            lock.acquire()
        except (Timeout, OSError):
            continue
        try:
            path.unlink()
            removed.append(f"{LOCKS}/{path.name}")
        except OSError:
            pass
        finally:
            lock.release()
    return removed


def release_lock_file(path: str) -> None:
    """Remove a lock file while its lock is still held (a waiter on the old file retries on a new one)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def move_aside(directory: Path) -> Path:
    """Rename the database (and its journal files) to `cache.db.damaged-<time>-<pid>`; the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    aside = directory / f"{DAMAGED}{stamp}-{os.getpid()}"
    for suffix in ("", "-wal", "-shm"):
        source = directory / f"{DATABASE}{suffix}"
        if source.exists():
            os.replace(source, f"{aside}{suffix}")
    return aside


def remove_everything(directory: Path, keep: tuple[str, ...] = ()) -> list[str]:
    """Delete every file and directory inside `directory` but those named in `keep`; the names
    whose deletion failed (a file another process creates again right after is not one of them)."""
    left: list[str] = []
    if not directory.is_dir():
        return left
    for name in sorted(set(os.listdir(directory)) - set(keep)):
        path = directory / name
        failed: list[BaseException] = []
        if path.is_dir() and not path.is_symlink():
            import shutil

            if sys.version_info >= (3, 12):
                shutil.rmtree(path, onexc=lambda _f, _p, exc: failed.append(exc))
            else:
                shutil.rmtree(path, onerror=lambda _f, _p, info: failed.append(info[1]))
        else:
            try:
                path.unlink()
            except OSError as exc:
                failed.append(exc)
        # gone already, or a folder another process has just written a new entry into
        if any(not isinstance(exc, FileNotFoundError) and getattr(exc, "errno", None) != errno.ENOTEMPTY for exc in failed):
            left.append(name)
    return left
