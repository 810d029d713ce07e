"""A bundle's parameter section (format 1.1): named weights stored once, outside the msgpack
payload, laid out for memory mapping and checked chunk by chunk.

Layout: the section starts at the first `SECTION_ALIGNMENT` boundary after the payload (the
gap is zero bytes) and runs to the end of the file. Each parameter's bytes start at a
multiple of `ENTRY_ALIGNMENT` within it. The section is hashed in `CHUNK_BYTES` chunks; the
chunk digests and their root (sha256 of the concatenated raw digests) are in the payload's
metadata, so the bundle digest covers them. Readers check the layout when a bundle is
opened and a chunk's bytes only when a kernel that uses it is first loaded.

Writing streams: each parameter's bytes come from a `ParameterData` reader in pieces of at
most `COPY_BYTES`, so building needs memory for one piece, not the model.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Iterator, Mapping, Sequence

from portkern.base.errors import BundleTruncatedError, DigestMismatchError, MalformedBundleError
from portkern.base.records import from_plain, frozen_record, to_plain

if TYPE_CHECKING:
    import mmap

#: The section starts on a page boundary, so it can be mapped as it is.
SECTION_ALIGNMENT = 4096
#: Each parameter starts on a 64-byte boundary within the section (what IREE's archives use).
ENTRY_ALIGNMENT = 64
#: The section is hashed in chunks of this many bytes (the last one may be shorter).
CHUNK_BYTES = 64 << 20
#: Readers refuse a section larger than this.
MAX_SECTION_BYTES = 1 << 40
#: Bytes read or written at a time while copying or hashing.
COPY_BYTES = 8 << 20
#: Bytes of a transposed parameter made at a time (`transposed_file_pieces`): at most this, and
#: at most a sixteenth of the parameter (but COPY_BYTES), so that a build's memory stays well
#: under the largest tensor; larger blocks map each source page fewer times.
TRANSPOSE_BYTES = 64 << 20
#: Source rows transposed at a time within such a block (a tile that stays in the CPU's cache).
TRANSPOSE_TILE_ROWS = 256
#: The scope IREE's importers put parameters in (`#stream.parameter.named<"model"::"...">`).
DEFAULT_SCOPE = "model"


@frozen_record
class Parameter:
    """One named parameter of a kernel: where its bytes lie in the section."""

    scope: str
    name: str
    #: Offset of its first byte from the start of the section.
    offset: int
    size: int

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Parameter":
        return from_plain(cls, data)


@frozen_record
class ParameterSection:
    """Where a bundle's parameter section lies in its file, and its chunk digests."""

    #: Offset of the section from the start of the file (a multiple of SECTION_ALIGNMENT).
    offset: int
    size: int
    chunk_bytes: int
    #: sha256 (hex) of each chunk, in order.
    chunks: tuple[str, ...]
    #: sha256 (hex) of the concatenated raw chunk digests.
    root: str

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ParameterSection":
        return from_plain(cls, data)

    @property
    def end(self) -> int:
        return self.offset + self.size

    def chunks_of(self, parameters: Iterable[Parameter]) -> list[int]:
        """Indices of the chunks that hold any byte of these parameters."""
        used: set[int] = set()
        for p in parameters:
            if p.size:
                used.update(range(p.offset // self.chunk_bytes, (p.offset + p.size - 1) // self.chunk_bytes + 1))
        return sorted(used)

    def chunk_span(self, index: int) -> tuple[int, int]:
        """(file offset, length) of a chunk."""
        start = index * self.chunk_bytes
        return self.offset + start, min(self.chunk_bytes, self.size - start)


def root_of(chunks: Sequence[str]) -> str:
    """The root digest of a list of chunk digests."""
    return hashlib.sha256(b"".join(bytes.fromhex(c) for c in chunks)).hexdigest()


def section_offset(payload_end: int) -> int:
    """Where the section starts when the payload ends at `payload_end`."""
    return -(-payload_end // SECTION_ALIGNMENT) * SECTION_ALIGNMENT


def check_layout(section: ParameterSection, payload_end: int, kernels: Mapping[str, Sequence[Parameter]]) -> None:
    """Refuse a section whose numbers do not fit together (MalformedBundleError)."""
    if section.offset != section_offset(payload_end):
        raise MalformedBundleError(f"parameter section starts at {section.offset}, not at {section_offset(payload_end)}")
    if section.chunk_bytes <= 0 or section.chunk_bytes % SECTION_ALIGNMENT:
        raise MalformedBundleError(f"parameter chunk size {section.chunk_bytes} is not a positive multiple of {SECTION_ALIGNMENT}")
    if section.size > MAX_SECTION_BYTES:
        raise MalformedBundleError(f"parameter section of {section.size} bytes is larger than the reader allows")
    count = -(-section.size // section.chunk_bytes)
    if len(section.chunks) != count:
        raise MalformedBundleError(f"parameter section of {section.size} bytes needs {count} chunk digests, has {len(section.chunks)}")
    if root_of(section.chunks) != section.root:
        raise DigestMismatchError("parameter chunk digests do not hash to their root")
    for kernel, parameters in kernels.items():
        seen: set[tuple[str, str]] = set()
        for p in parameters:
            if (p.scope, p.name) in seen:
                raise MalformedBundleError(f"kernel {kernel!r} names parameter {p.scope}::{p.name} twice")
            seen.add((p.scope, p.name))
            if p.offset % ENTRY_ALIGNMENT or p.offset < 0 or p.size < 0 or p.offset + p.size > section.size:
                raise MalformedBundleError(
                    f"kernel {kernel!r}: parameter {p.scope}::{p.name} ({p.size} bytes at {p.offset}) "
                    f"is not an aligned range of the {section.size}-byte parameter section"
                )


def check_file_size(section: ParameterSection, file_size: int, where: str = "") -> None:
    """A file must end exactly where its parameter section does."""
    if file_size < section.end:
        raise BundleTruncatedError(f"{where}truncated: the parameter section ends at byte {section.end}, the file at {file_size}")
    if file_size > section.end:
        raise MalformedBundleError(f"{where}{file_size - section.end} unexpected bytes after the parameter section")


def verify_chunks(f: BinaryIO, section: ParameterSection, indices: Iterable[int], where: str = "") -> None:
    """Hash the given chunks of an open bundle file; DigestMismatchError (or
    BundleTruncatedError) naming the first chunk that does not match."""
    for index in indices:
        start, length = section.chunk_span(index)
        digest = hashlib.sha256()
        f.seek(start)
        remaining = length
        while remaining:
            piece = f.read(min(COPY_BYTES, remaining))
            if not piece:
                raise BundleTruncatedError(f"{where}truncated inside parameter chunk {index}")
            digest.update(piece)
            remaining -= len(piece)
        if digest.hexdigest() != section.chunks[index]:
            raise DigestMismatchError(
                f"{where}parameter chunk {index} (bytes {start}..{start + length}) does not match its digest "
                "(corrupted or modified); its parameters are not used"
            )


@functools.cache
def _reference() -> re.Pattern[str]:
    """A parameter reference in MLIR text: its scope and name, escaped."""
    return re.compile(r'#(?:stream|flow)\.parameter\.named<"((?:[^"\\]|\\.)*)"::"((?:[^"\\]|\\.)*)">')


@functools.cache
def _escape() -> re.Pattern[bytes]:
    """An MLIR string escape: a backslash, a quote or two hex digits after a backslash."""
    return re.compile(rb"\\(\\|\"|[0-9A-Fa-f]{2})")


def referenced(text: bytes | str) -> list[tuple[str, str]]:
    """(scope, name) of every parameter that MLIR text refers to, in order of first reference."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return list(dict.fromkeys((_unescape(s), _unescape(n)) for s, n in _reference().findall(text)))


def _unescape(text: str) -> str:
    def one(match: re.Match[bytes]) -> bytes:
        token = match.group(1)
        return token if token in (b"\\", b'"') else bytes([int(token, 16)])

    return _escape().sub(one, text.encode()).decode("utf-8", errors="replace")


# --- writing --------------------------------------------------------------------


#: Yields a parameter's bytes in pieces, in order.
Reader = Callable[[], Iterator[bytes | memoryview]]


@frozen_record
class ParameterData:
    """A parameter to be written: its kernel, name, size and where its bytes come from."""

    kernel: str
    scope: str
    name: str
    size: int
    read: Reader


def layout(data: Sequence[ParameterData]) -> tuple[dict[str, tuple[Parameter, ...]], int]:
    """Each kernel's parameters placed in a section, in the given order, and the section size."""
    placed: dict[str, list[Parameter]] = {}
    end = 0
    for item in data:
        offset = -(-end // ENTRY_ALIGNMENT) * ENTRY_ALIGNMENT
        placed.setdefault(item.kernel, []).append(Parameter(item.scope, item.name, offset, item.size))
        end = offset + item.size
    return {k: tuple(v) for k, v in placed.items()}, end


class _ChunkHasher:
    """sha256 per CHUNK_BYTES of a byte stream."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self.done: list[str] = []
        self._digest = hashlib.sha256()
        self._filled = 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            take = min(len(view), self.chunk_bytes - self._filled)
            self._digest.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.chunk_bytes:
                self.finish()

    def finish(self) -> None:
        if self._filled:
            self.done.append(self._digest.hexdigest())
        self._digest, self._filled = hashlib.sha256(), 0


def write_section(f: BinaryIO, data: Sequence[ParameterData], placed: Mapping[str, Sequence[Parameter]], offset: int, size: int) -> ParameterSection:
    """Stream every parameter's bytes into `f` at `offset` (zero padding between them) and
    return the section with its chunk digests. MalformedBundleError if a reader yields
    another number of bytes than its parameter's size."""
    hasher = _ChunkHasher(CHUNK_BYTES)
    f.seek(offset)
    position = 0
    where = {(k, p.scope, p.name): p for k, ps in placed.items() for p in ps}
    for item in data:
        parameter = where[(item.kernel, item.scope, item.name)]
        if parameter.offset > position:
            pad = bytes(parameter.offset - position)
            f.write(pad)
            hasher.update(pad)
        written = 0
        for piece in item.read():
            written += len(piece)
            if written > item.size:
                break
            f.write(piece)
            hasher.update(piece)
        if written != item.size:
            raise MalformedBundleError(f"parameter {item.name!r} of {item.kernel!r} gave {written} bytes, expected {item.size}")
        position = parameter.offset + item.size
    if position != size:
        raise MalformedBundleError(f"parameter section ended at {position}, expected {size}")
    hasher.finish()
    chunks = tuple(hasher.done)
    return ParameterSection(offset, size, CHUNK_BYTES, chunks, root_of(chunks))


def file_pieces(path: os.PathLike[str] | str, offset: int, length: int) -> Reader:
    """A reader of `length` bytes of a file from `offset`, COPY_BYTES at a time."""

    def read() -> Iterator[bytes | memoryview]:
        with open(path, "rb") as f:
            f.seek(offset)
            remaining = length
            while remaining:
                piece = f.read(min(COPY_BYTES, remaining))
                if not piece:
                    return
                remaining -= len(piece)
                yield piece

    return read


def transposed_file_pieces(path: os.PathLike[str] | str, offset: int, rows: int, cols: int, itemsize: int) -> Reader:
    """A reader of the transpose (cols x rows) of a row-major rows x cols matrix of `itemsize`-byte
    elements that lies in a file from `offset`: made a block of whole output rows at a time (see
    TRANSPOSE_BYTES) from a read-only mapping whose pages are let go as they are read, so memory
    stays about one block."""
    import mmap

    import numpy as np

    element = np.dtype(f"u{itemsize}") if itemsize in (1, 2, 4, 8) else np.dtype(f"V{itemsize}")
    length = rows * cols * itemsize
    block_bytes = min(TRANSPOSE_BYTES, max(COPY_BYTES, length // 16))
    per_block = max(1, min(cols, block_bytes // max(1, rows * itemsize)))

    def read() -> Iterator[bytes | memoryview]:
        if length == 0:
            return
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        with open(path, "rb") as f, mmap.mmap(f.fileno(), offset - start + length, offset=start, access=mmap.ACCESS_READ) as mapped:
            source = np.frombuffer(mapped, dtype=element, count=rows * cols, offset=offset - start).reshape(rows, cols)
            try:
                for first in range(0, cols, per_block):
                    last = min(cols, first + per_block)
                    block = np.empty((last - first, rows), dtype=element)
                    for row in range(0, rows, TRANSPOSE_TILE_ROWS):
                        end = min(rows, row + TRANSPOSE_TILE_ROWS)
                        block[:, row:end] = source[row:end, first:last].T
                        # the OS maps whole neighbourhoods of the rows read: let them go at once
                        _release(mapped, offset - start + row * cols * itemsize, offset - start + end * cols * itemsize)
                    yield block.reshape(-1).view(np.uint8).data
                    del block
            finally:
                del source

    return read


def _release(mapped: mmap.mmap, begin: int, end: int) -> None:
    """Drop a read-only mapping's pages in [begin, end) from this process (not from the page cache)."""
    import mmap

    if hasattr(mmap, "MADV_DONTNEED"):
        begin -= begin % mmap.PAGESIZE
        mapped.madvise(mmap.MADV_DONTNEED, begin, min(len(mapped), end + mmap.PAGESIZE) - begin)


def bytes_pieces(data: bytes | memoryview) -> Reader:
    """A reader of bytes already in memory."""

    def read() -> Iterator[bytes | memoryview]:
        view = memoryview(data)
        for start in range(0, len(view), COPY_BYTES):
            yield view[start : start + COPY_BYTES]

    return read
