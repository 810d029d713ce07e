"""A bundle's parameter section on the device: bytes no other program changes while a process
computes with them, checked before use.

A bundle file of at most `READ_LIMIT` bytes is read whole into this process's memory when a
kernel first needs its parameters. A larger one is memory-mapped, not from the path it was
loaded from but from portkern's own copy of that file: `parameters/<bundle digest>.pkb` in a
cache directory, made once per bundle and mapped by every later process that loads a bundle
with that digest, from any path. The copy is made from the file opened at `load`, under the
cache's cross-process lock: written under a temporary name a chunk at a time
(`os.copy_file_range`, which shares the blocks where the file system can), each chunk hashed
from the copy, then made durable and read-only and renamed into place; the cache remembers it as
checked whole for its identity (path, device, inode, size, mtime). A copy is mapped only when
its identity is the one remembered: any other is made again. Where no copy can be kept (no
writable cache directory, the cache disabled, no room for it on its file system, a failed
write), the file is read into this process's memory whole instead, and that is logged.

So a bundle written into, truncated or zero-filled at its path after `load` cannot change
the parameters of a bundle loaded from it: its kernels keep computing with the bundle loaded.
A file changed after `load` and before its parameters were first read or copied is refused
(`BundleChangedError`: another bundle now, or changed while it was read; `BundleTruncatedError`;
`DigestMismatchError`).

Before a kernel's first executable is made, the chunks holding its parameters are hashed in the
memory read, unless this cache remembers them as checked for the same file (path, device,
inode, size, mtime and ctime, and the section's root); a copy's chunks were all hashed as it was
made, so a warm start of a 5 GB bundle hashes nothing. A chunk that does not match raises
`DigestMismatchError`; nothing is remembered from it. A mapped kernel's parameters are then read
ahead (`MADV_WILLNEED`), so that a first call after the copy left the page cache reads it from
the disk in order rather than a page at a time.

Each use of a copy stamps its access time (at most once per `STAMP_S`); when a copy is made,
copies not used for `UNUSED_S` and partial copies of processes that are gone are removed, and
`portkern cache clear` removes them all (a process with a copy mapped keeps its bytes).
"""

from __future__ import annotations

import errno
import io
import mmap
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO, cast

from portkern.base.errors import BundleChangedError, BundleError, BundleTruncatedError
from portkern.base.framing import HEADER_SIZE, open_regular
from portkern.base.logs import logger
from portkern.base.records import frozen_record
from portkern.base.settings import format_size
from portkern.cache.keys import parameters_key
from portkern.cache.layout import PARAMETERS
from portkern.cache.scratch import part_path, stale_part
from portkern.cache.store import Store
from portkern.portable.bundle import Bundle, KernelRecord
from portkern.portable.parameters import Parameter, ParameterSection, check_file_size, verify_chunks

log = logger(__name__)

#: Store record kind of the memo "these chunks of this file were checked".
RECORD_KIND = "w"
#: A bundle file of at most this many bytes is read into memory whole; a larger one is mapped
#: from portkern's copy of it.
READ_LIMIT = 4 << 20
#: A copy is made only where its file system keeps this many bytes free beside it.
SPARE_BYTES = 1 << 30
#: A copy not used for this many seconds is removed when another copy is made in its folder.
UNUSED_S = 7 * 86400.0
#: A copy's access time is stamped when it is used and older than this many seconds.
STAMP_S = 3600.0
#: Bytes copied at a time where the file system cannot copy between files itself.
COPY_PIECE = 8 << 20
#: Where `os.copy_file_range` refuses a pair of files: copy through this process's memory.
_PLAIN_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.ETXTBSY}


@frozen_record
class KernelParameters:
    """One kernel's parameters, in memory no other program writes: what the runtime needs."""

    #: The whole bundle file, read into memory or mapped read-only from portkern's copy
    #: (parameters lie at `section.offset + p.offset`).
    buffer: mmap.mmap
    section: ParameterSection
    entries: tuple[Parameter, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the kernel's parameters."""
        return sum(p.size for p in self.entries)

    def scopes(self) -> dict[str, list[tuple[str, int, int]]]:
        """Per scope: (name, file offset, size) of each parameter."""
        found: dict[str, list[tuple[str, int, int]]] = {}
        for p in self.entries:
            found.setdefault(p.scope, []).append((p.name, self.section.offset + p.offset, p.size))
        return found


def copy_folders(store: Store) -> tuple[list[Path], Path | None]:
    """The folders copies are looked up in (each usable cache directory's `parameters/`, in
    lookup order) and the one new copies go to (None when no cache directory is writable)."""
    usable = [place for place in store.places() if place["state"] != "not usable"]
    writable = next((Path(p["directory"]) / PARAMETERS for p in usable if p["state"] == "writable"), None)
    return [Path(p["directory"]) / PARAMETERS for p in usable], writable


def copy_key(path: Path, st: os.stat_result, root: str) -> str:
    """The memo key of a copy: its identity less ctime (which stamping its use changes)."""
    return parameters_key(str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, 0, root)


class MappedSection:
    """The parameter section of one opened bundle file. The file is opened when this is made (at
    `load`): whatever is renamed over its path later, the bundle reads the file it was loaded from."""

    def __init__(self, bundle: Bundle, path: Path, store: Store) -> None:
        if bundle.parameters is None:
            raise BundleError(f"{path}: bundle {bundle.name!r} has no parameter section")
        self.bundle = bundle
        self.section = bundle.parameters
        self.path = path
        self.store = store
        self._lock = threading.Lock()
        try:
            self._file: io.BufferedReader | None = cast(io.BufferedReader, open_regular(path, "the parameter section", BundleError)[0])
        except OSError as exc:
            raise BundleError(f"{path}: cannot read the parameter section: {exc.strerror or exc}") from None
        self._buffer: mmap.mmap | None = None
        #: Whether `_buffer` maps portkern's copy (else: the file read into memory).
        self._mapped = False
        self._identity = ""
        self._checked: set[int] = set()
        self._failed: BundleError | None = None

    def _open(self, where: str) -> mmap.mmap:
        """The file's bytes in memory no other program writes, on first use: portkern's copy
        mapped, else the file read; the chunks checked before recalled."""
        if self._buffer is not None:
            return self._buffer
        if self._failed is not None:
            raise type(self._failed)(str(self._failed))
        f = self._file
        assert f is not None
        self._file = None
        try:
            st = os.fstat(f.fileno())
            check_file_size(self.section, st.st_size, f"{self.path}: ")
            self._same_bundle(os.pread(f.fileno(), 32, HEADER_SIZE - 32))
            kept = self._kept(f, st, where) if st.st_size > READ_LIMIT else None
            if kept is not None:
                (buffer, self._identity), self._mapped = kept, True
            else:
                buffer = self._read(f, st)
                self._identity = parameters_key(
                    str(self.path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, self.section.root
                )
        except (OSError, BundleError) as exc:
            failed = exc if isinstance(exc, BundleError) else BundleError(f"{self.path}: cannot read the parameter section: {exc.strerror or exc}")
            self._failed = failed  # and every later use fails the same way (the file is closed)
            raise failed from None
        except BaseException:  # interrupted (KeyboardInterrupt): the file is closed
            self._failed = BundleError(f"{self.path}: reading the parameter section was interrupted: load it again")
            raise
        finally:
            f.close()
        self._buffer = buffer
        if self._mapped:  # a copy is mapped only when checked whole
            self._checked = set(range(len(self.section.chunks)))
            return buffer
        remembered = self.store.get_record(RECORD_KIND, self._identity) or {}
        chunks = remembered.get("chunks", [])
        if isinstance(chunks, list):
            self._checked = {c for c in chunks if isinstance(c, int) and 0 <= c < len(self.section.chunks)}
        return buffer

    def _read(self, f: io.BufferedReader, st: os.stat_result) -> mmap.mmap:
        """The whole file in private memory (page-aligned, as a mapping would be); BundleChangedError
        when it changed while it was read."""
        buffer = mmap.mmap(-1, st.st_size)
        view = memoryview(buffer)
        try:
            done = 0
            while done < st.st_size:
                count = f.readinto(view[done:])
                if not count:
                    break
                done += count
        finally:
            view.release()
        if done < st.st_size or _changed(f.fileno(), st):
            raise BundleChangedError(f"{self.path}: the bundle file was changed in place while its parameter section was read: load it again")
        return buffer

    def _same_bundle(self, digest: bytes) -> None:
        """Refuse a file whose header (its payload digest) is another bundle's than the one loaded
        (written over since `load` read it): its section is not the one the loaded metadata describes."""
        if self.bundle.digest and digest.hex() != self.bundle.digest:
            raise BundleChangedError(f"{self.path}: the file now holds another bundle than the one loaded from it: load it again")

    # --- portkern's copy ------------------------------------------------------------

    def _kept(self, f: io.BufferedReader, st: os.stat_result, where: str) -> tuple[mmap.mmap, str] | None:
        """portkern's checked copy of the file, mapped (found, or made now from `f`), and its memo
        key; None where no copy can be kept."""
        digest = self.bundle.digest
        if not digest:
            return None
        name = f"{digest}.pkb"
        folders, writable = copy_folders(self.store)
        for folder in folders:
            found = self._checked_copy(folder / name)
            if found is not None:
                return found
        size = format_size(st.st_size)
        if writable is None:
            log.warning("%s: its parameters (%s) are read into this process's memory: no cache directory is writable for a copy", self.path, size)
            return None
        with self.store.lock(f"parameters-{digest}"[:32]):
            found = self._checked_copy(writable / name)  # made meanwhile by another process
            if found is not None:
                return found
            try:
                writable.mkdir(parents=True, exist_ok=True)
                sweep(writable, self.store)
                space = os.statvfs(writable)
                free = space.f_bavail * space.f_frsize
                if free < st.st_size + SPARE_BYTES:
                    log.warning("%s: its parameters (%s) are read into this process's memory: %s has %s free, too little for a copy",
                                self.path, size, writable, format_size(free))
                    return None
                return self._copy(f, st, writable / name, where)
            except OSError as exc:
                log.warning("%s: its parameters (%s) are read into this process's memory: no copy could be made in %s (%s)",
                            self.path, size, writable, exc.strerror or exc)
                return None

    def _checked_copy(self, path: Path) -> tuple[mmap.mmap, str] | None:
        """The copy at `path` mapped, when it is the file this cache remembers as checked whole."""
        try:  # (whatever is at the path: a named pipe there is refused, not waited on)
            file, size = open_regular(path, "a parameter copy", BundleError, buffering=0)
        except (OSError, BundleError):
            return None
        with file:
            st = os.fstat(file.fileno())
            if size != self.section.end:
                return None
            key = copy_key(path, st, self.section.root)
            remembered = self.store.get_record(RECORD_KIND, key) or {}
            if remembered.get("chunks") != list(range(len(self.section.chunks))):
                return None
            try:
                buffer = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            except OSError:
                return None
            if buffer[HEADER_SIZE - 32 : HEADER_SIZE].hex() != self.bundle.digest:
                buffer.close()
                return None
            if time.time_ns() - st.st_atime_ns > STAMP_S * 1e9:
                try:  # through the open file: a copy renamed over the path since keeps its times
                    os.utime(file.fileno(), ns=(time.time_ns(), st.st_mtime_ns))
                except OSError:  # another user's copy: not stamped
                    pass
        return buffer, key

    def _copy(self, f: io.BufferedReader, st: os.stat_result, target: Path, where: str) -> tuple[mmap.mmap, str]:
        """Copy the file opened at `load` to `target` (whole or not at all), each chunk checked
        in the copy; the copy mapped, and its memo key (recorded as checked whole)."""
        started = time.monotonic()
        part = part_path(target)
        out = open(os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), "r+b", buffering=0)
        try:
            damaged: BundleError | None = None
            try:
                _copy_range(f.fileno(), out.fileno(), 0, self.section.offset)
                for index in range(len(self.section.chunks)):
                    _copy_range(f.fileno(), out.fileno(), *self.section.chunk_span(index))
                    verify_chunks(cast(BinaryIO, out), self.section, [index], where)
            except BundleError as e:
                damaged = e
            if _changed(f.fileno(), st):
                raise BundleChangedError(f"{self.path}: the bundle file was changed in place while its parameters were copied: load it again") from None
            if damaged is not None:
                raise damaged
            os.fsync(out.fileno())
            os.fchmod(out.fileno(), 0o444)
            os.replace(part, target)
            made = os.fstat(out.fileno())
            buffer = mmap.mmap(out.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            try:
                part.unlink()
            except OSError:
                pass
            raise
        finally:
            out.close()
        key = copy_key(target, made, self.section.root)
        forget(self.store, {str(target)})  # the copy this one replaced, if any
        self.store.put_record(RECORD_KIND, key, {"chunks": list(range(len(self.section.chunks))), "path": str(target)}, memo=True)
        log.debug("%s: parameters copied to %s and checked (%s, %.2f s)", self.path, target, format_size(made.st_size), time.monotonic() - started)
        return buffer, key

    # --- kernels ------------------------------------------------------------------------

    def for_kernel(self, record: KernelRecord) -> KernelParameters:
        """The kernel's parameters, their chunks checked (hashed now, or remembered as checked)."""
        where = f"{self.path}: kernel {record.name!r}: "
        with self._lock:
            buffer = self._open(where)
            needed = [c for c in self.section.chunks_of(record.parameters) if c not in self._checked]
            if needed:
                # hashed in the memory the runtime reads
                verify_chunks(cast(BinaryIO, buffer), self.section, needed, where)
                self._checked.update(needed)
                self.store.put_record(RECORD_KIND, self._identity, {"chunks": sorted(self._checked), "path": str(self.path)}, memo=True)
            if self._mapped:
                self._prefetch(record, buffer)
            return KernelParameters(buffer, self.section, record.parameters)

    def _prefetch(self, record: KernelRecord, buffer: mmap.mmap) -> None:
        """Ask the OS to read the kernel's parameters ahead, in the background: a call touches
        its weights in tile order, and a page at a time would be far slower from the disk."""
        if not record.parameters or not hasattr(mmap, "MADV_WILLNEED"):
            return
        start = self.section.offset + min(p.offset for p in record.parameters)
        end = self.section.offset + max(p.offset + p.size for p in record.parameters)
        start -= start % mmap.PAGESIZE
        try:
            buffer.madvise(mmap.MADV_WILLNEED, start, end - start)
        except OSError:  # a hint only
            pass


def sweep(folder: Path, store: Store) -> list[Path]:
    """Remove the partial copies of processes that are gone and the copies not used for
    `UNUSED_S` (and what the cache remembers of them); the paths removed."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        path = Path(entry.path)
        try:
            if entry.name.endswith(".part"):
                if not stale_part(entry.name):
                    continue
            elif not (entry.name.endswith(".pkb") and now - entry.stat(follow_symlinks=False).st_atime > UNUSED_S):
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    forget(store, {str(path) for path in removed if path.suffix == ".pkb"})
    return removed


def forget(store: Store, paths: set[str]) -> None:
    """Delete what the cache remembers as checked for the files at these paths."""
    if paths:
        for key, record in list(store.records(RECORD_KIND)):
            if record.get("path") in paths:
                store.delete_record(RECORD_KIND, key)


def _changed(fd: int, st: os.stat_result) -> bool:
    """Whether the open file's size or modification time is no longer `st`'s."""
    now = os.fstat(fd)
    return (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns)


def _copy_range(source: int, target: int, offset: int, length: int) -> None:
    """Copy bytes [offset, offset + length) of one open file to the same place in another (by the
    file system where it can); BundleTruncatedError when the source ends first."""
    end = offset + length
    plain = not hasattr(os, "copy_file_range")
    while offset < end:
        count = 0
        if not plain:
            try:
                count = os.copy_file_range(source, target, end - offset, offset, offset)
            except OSError as exc:
                if exc.errno not in _PLAIN_COPY:
                    raise
                plain = True
        if plain:
            piece = os.pread(source, min(COPY_PIECE, end - offset), offset)
            count = len(piece)
            written = 0
            while written < count:
                written += os.pwrite(target, memoryview(piece)[written:], offset + written)
        if not count:
            raise BundleTruncatedError(f"the bundle file ends at byte {offset}, inside its parameter section")
        offset += count
