"""A bundle's parameter section on the device: mapped from the file, checked before use.

The section is memory-mapped read-only once per opened bundle; the IREE runtime reads each
parameter straight from the mapping (`portkern.jit.runtime`). Before a kernel's first
executable is made, the chunks holding its parameters are hashed, unless this cache
remembers that chunk as checked for the same file (path, device, inode, size, mtime and
ctime, and the section's root): a warm start of a 5 GB bundle hashes nothing. A chunk
that does not match raises `DigestMismatchError`; nothing is remembered from it. The
kernel's parameters are then read ahead (`MADV_WILLNEED`), so that a first call after the
file left the page cache reads it from the disk in order rather than a page at a time.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from portkern.base.errors import BundleError
from portkern.cache.keys import parameters_key
from portkern.cache.store import Store
from portkern.portable.bundle import Bundle, KernelRecord
from portkern.portable.parameters import Parameter, ParameterSection, check_file_size, verify_chunks

#: Store record kind of the memo "these chunks of this file were checked".
RECORD_KIND = "w"


@dataclass(frozen=True)
class KernelParameters:
    """One kernel's parameters, in a mapped section: what the runtime needs."""

    #: The whole bundle file, mapped read-only (parameters lie at `section.offset + p.offset`).
    buffer: mmap.mmap
    section: ParameterSection
    entries: tuple[Parameter, ...]

    def scopes(self) -> dict[str, list[tuple[str, int, int]]]:
        """Per scope: (name, file offset, size) of each parameter."""
        found: dict[str, list[tuple[str, int, int]]] = {}
        for p in self.entries:
            found.setdefault(p.scope, []).append((p.name, self.section.offset + p.offset, p.size))
        return found


class MappedSection:
    """The parameter section of one opened bundle file."""

    def __init__(self, bundle: Bundle, path: Path, store: Store) -> None:
        if bundle.parameters is None:
            raise BundleError(f"{path}: bundle {bundle.name!r} has no parameter section")
        self.section = bundle.parameters
        self.path = path
        self.store = store
        self._lock = threading.Lock()
        self._file: BinaryIO | None = None
        self._buffer: mmap.mmap | None = None
        self._identity = ""
        self._checked: set[int] = set()

    def _open(self) -> tuple[BinaryIO, mmap.mmap]:
        """The open file and its mapping: opened and mapped on first use, recalling which chunks
        were checked before."""
        if self._file is not None and self._buffer is not None:
            return self._file, self._buffer
        try:
            f = open(self.path, "rb")
        except OSError as exc:
            raise BundleError(f"{self.path}: cannot read the parameter section: {exc.strerror or exc}") from None
        try:
            st = os.fstat(f.fileno())
            check_file_size(self.section, st.st_size, f"{self.path}: ")
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            f.close()
            raise
        self._file, self._buffer = f, buffer
        self._identity = parameters_key(str(self.path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, self.section.root)
        remembered = self.store.get_record(RECORD_KIND, self._identity) or {}
        chunks = remembered.get("chunks", [])
        if isinstance(chunks, list):
            self._checked = {c for c in chunks if isinstance(c, int) and 0 <= c < len(self.section.chunks)}
        return f, buffer

    def for_kernel(self, record: KernelRecord) -> KernelParameters:
        """The kernel's parameters, their chunks checked (hashed now, or remembered as checked)."""
        with self._lock:
            file, buffer = self._open()
            needed = [c for c in self.section.chunks_of(record.parameters) if c not in self._checked]
            if needed:
                verify_chunks(file, self.section, needed, f"{self.path}: kernel {record.name!r}: ")
                self._checked.update(needed)
                self.store.put_record(RECORD_KIND, self._identity, {"chunks": sorted(self._checked), "path": str(self.path)})
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
