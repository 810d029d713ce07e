"""Scratch directories of portkern processes (PoCL's build cache, ...) and the sweep of dead ones.

A scratch directory is named `portkern-<purpose>-<pid>-<random>` in the system's
temporary directory, so a later `portkern cache verify` can tell that the
process that made it is gone (killed before its exit handler ran).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: PoCL directories named without a pid (older portkern) count as orphaned after this many seconds.
LEGACY_AGE_S = 86400.0


def make(purpose: str) -> str:
    """A new scratch directory for this process (`purpose` is one word, e.g. "pocl")."""
    import tempfile  # (shutil and tempfile: loaded by what makes or removes scratch, not by the warm path)

    return tempfile.mkdtemp(prefix=f"portkern-{purpose}-{os.getpid()}-")


def remove_of(pid: int, root: str | Path | None = None) -> None:
    """Remove the scratch directories of a process this one stopped (it had no chance to)."""
    import shutil
    import tempfile

    base = Path(root or tempfile.gettempdir())
    try:
        paths = [p for p in base.glob(f"portkern-*-{int(pid)}-*") if p.is_dir() and not p.is_symlink()]
    except OSError:
        return
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (on this machine, whoever owns it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def part_path(path: Path) -> Path:
    """A hidden partial file beside `path`, named for this process, to be written whole and then
    renamed over `path` (`stale_part` knows it once its process is gone)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.part")


def stale_part(name: str) -> bool:
    """Whether a file named as `part_path` names them belongs to a process that is gone."""
    fields = name.split(".")
    return name.endswith(".part") and len(fields) >= 3 and fields[-3].isdigit() and not alive(int(fields[-3]))


def orphaned(root: str | Path | None = None) -> list[Path]:
    """Scratch directories under `root` (default: the temporary directory) whose process is gone."""
    import tempfile

    found = []
    base = Path(root or tempfile.gettempdir())
    try:
        candidates = [p for p in base.glob("portkern-*-*") if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    for path in candidates:
        parts = path.name.split("-", 3)
        if len(parts) == 4 and parts[2].isdigit():
            if not alive(int(parts[2])):
                found.append(path)
        elif len(parts) == 3 and parts[1] == "pocl":
            try:
                if time.time() - path.stat().st_mtime > LEGACY_AGE_S:
                    found.append(path)
            except OSError:
                continue
    return sorted(found)


def sweep(root: str | Path | None = None) -> list[Path]:
    """Remove the orphaned scratch directories; the ones removed."""
    import shutil

    removed = []
    for path in orphaned(root):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed
