"""A bundle's parameter section on the device: held by this process, checked before use.

A bundle file of at most `READ_LIMIT` bytes is read whole into this process's memory when a
kernel first needs its parameters; a larger one is memory-mapped read-only, once per opened
bundle. The IREE runtime reads each parameter from that memory (`portkern.jit.runtime`). Before
a kernel's first executable is made, the chunks holding its parameters are hashed (a file read
whole: the bytes read), unless this cache remembers that chunk as checked for the same file
(path, device, inode, size, mtime and ctime, and the section's root): a warm start of a 5 GB
bundle hashes nothing. A chunk that does not match raises `DigestMismatchError`; nothing is
remembered from it. A mapped kernel's parameters are then read ahead (`MADV_WILLNEED`), so
that a first call after the file left the page cache reads it from the disk in order rather
than a page at a time.

A file replaced by renaming another over its path (as `portkern build` writes) changes
nothing for a bundle already loaded: it keeps the file it opened at `load`. A file changed in place
(written into, truncated) would change a mapping under the runtime: wrong results from the
new bytes, or SIGBUS from a page cut off. A private mapping would not help: on Linux it shows
the file's changes on every page it has not written, and truncation removes even the pages it
copied. So a mapped file's size and modification time (of the file opened at `load`: its inode
stays the same) are checked when a kernel's parameters are taken from it and before and after
each call (`KernelParameters.unchanged`); a change raises `BundleChangedError`, and a call
during which the file changed returns no result. What remains for a mapped file: a truncation
while a call runs faults the process, and a same-size write within the file system's timestamp
granularity of the file's previous modification goes unseen. A file read whole is immune to both.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, ContextManager, cast

from portkern.base.errors import BundleChangedError, BundleError
from portkern.base.framing import HEADER_SIZE
from portkern.cache.keys import parameters_key
from portkern.cache.store import Store
from portkern.portable.bundle import Bundle, KernelRecord
from portkern.portable.parameters import Parameter, ParameterSection, check_file_size, verify_chunks

#: Store record kind of the memo "these chunks of this file were checked".
RECORD_KIND = "w"
#: A bundle file of at most this many bytes is read into memory whole; a larger one is mapped.
READ_LIMIT = 4 << 20
#: Nothing to check around a call on parameters read into memory.
_NOTHING = contextlib.nullcontext()


class Watch:
    """A mapped bundle file's size and modification time as they were checked: `check` (and
    `with watch:`, before and after) raises BundleChangedError once the file was written into or
    truncated. (The open file is the same inode for good: a rename over its path leaves it be.)"""

    __slots__ = ("file", "fd", "path", "size", "mtime_ns")

    def __init__(self, file: io.BufferedReader, path: Path, st: os.stat_result) -> None:
        self.file = file
        self.fd = file.fileno()
        self.path = path
        self.size = st.st_size
        self.mtime_ns = st.st_mtime_ns

    def check(self) -> None:
        st = os.fstat(self.fd)
        if st.st_size != self.size or st.st_mtime_ns != self.mtime_ns:
            raise BundleChangedError(
                f"{self.path}: the bundle file was changed in place (written into or truncated) while loaded; "
                "its parameters are not used: load it again, and replace a bundle in use by renaming a new file over it"
            )

    def __enter__(self) -> None:
        self.check()

    def __exit__(self, *exc: object) -> None:
        self.check()


@dataclass(frozen=True)
class KernelParameters:
    """One kernel's parameters, in the memory that holds its bundle file: what the runtime needs."""

    #: The whole bundle file, read into memory or mapped read-only (parameters lie at
    #: `section.offset + p.offset`).
    buffer: mmap.mmap
    section: ParameterSection
    entries: tuple[Parameter, ...]
    #: The mapped file's identity (None: the file was read into memory whole).
    watch: Watch | None = None

    def scopes(self) -> dict[str, list[tuple[str, int, int]]]:
        """Per scope: (name, file offset, size) of each parameter."""
        found: dict[str, list[tuple[str, int, int]]] = {}
        for p in self.entries:
            found.setdefault(p.scope, []).append((p.name, self.section.offset + p.offset, p.size))
        return found

    def unchanged(self) -> ContextManager[None]:
        """What a call on these parameters runs inside: BundleChangedError before it when the
        mapped file has changed, and after it (its results dropped) when it changed meanwhile."""
        return self.watch if self.watch is not None else _NOTHING


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
            self._file: io.BufferedReader | None = open(path, "rb")
        except OSError as exc:
            raise BundleError(f"{path}: cannot read the parameter section: {exc.strerror or exc}") from None
        self._buffer: mmap.mmap | None = None
        self._watch: Watch | None = None
        self._identity = ""
        self._checked: set[int] = set()
        self._failed: BundleError | None = None

    def _open(self) -> mmap.mmap:
        """The file's bytes in memory: read or mapped on first use, recalling which chunks were
        checked before; BundleChangedError once a mapped file was changed in place."""
        if self._buffer is not None:
            if self._watch is not None:
                self._watch.check()
            return self._buffer
        if self._failed is not None:
            raise type(self._failed)(str(self._failed))
        f = self._file
        assert f is not None
        self._file = None
        try:
            st = os.fstat(f.fileno())
            check_file_size(self.section, st.st_size, f"{self.path}: ")
            if st.st_size <= READ_LIMIT:
                buffer, watch = self._read(f, st), None
            else:
                watch = Watch(f, self.path, st)
                buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                watch.check()  # the file mapped is the file whose size was checked
            self._same_bundle(buffer)
        except (OSError, BundleError) as exc:
            f.close()
            failed = exc if isinstance(exc, BundleError) else BundleError(f"{self.path}: cannot read the parameter section: {exc.strerror or exc}")
            self._failed = failed  # and every later use fails the same way (the file is closed)
            raise failed from None
        except BaseException:
            f.close()
            raise
        if watch is None:
            f.close()
        self._buffer, self._watch = buffer, watch
        self._identity = parameters_key(str(self.path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, self.section.root)
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
        after = os.fstat(f.fileno())
        if done < st.st_size or (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            raise BundleChangedError(f"{self.path}: the bundle file was changed in place while its parameter section was read: load it again")
        return buffer

    def _same_bundle(self, buffer: mmap.mmap) -> None:
        """Refuse a file whose header is another bundle's than the one loaded (replaced since
        `load` read it): its section is not the one the loaded metadata describes."""
        if self.bundle.digest and buffer[HEADER_SIZE - 32 : HEADER_SIZE].hex() != self.bundle.digest:
            raise BundleChangedError(f"{self.path}: the file now holds another bundle than the one loaded from it: load it again")

    def for_kernel(self, record: KernelRecord) -> KernelParameters:
        """The kernel's parameters, their chunks checked (hashed now, or remembered as checked)."""
        with self._lock:
            buffer = self._open()
            needed = [c for c in self.section.chunks_of(record.parameters) if c not in self._checked]
            if needed:
                # A mapped file is hashed through reads (a truncated file is short, not a fault), then
                # its identity checked; a file read whole is hashed in the memory the runtime reads.
                source = self._watch.file if self._watch is not None else cast(BinaryIO, buffer)
                verify_chunks(source, self.section, needed, f"{self.path}: kernel {record.name!r}: ")
                if self._watch is not None:
                    self._watch.check()
                self._checked.update(needed)
                self.store.put_record(RECORD_KIND, self._identity, {"chunks": sorted(self._checked), "path": str(self.path)})
            if self._watch is not None:
                self._prefetch(record, buffer)
            return KernelParameters(buffer, self.section, record.parameters, self._watch)

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
