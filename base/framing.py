"""The framing shared by portkern's files (bundles, cache exports): a checked msgpack payload,
and the one bounded file read every reader of a user's file goes through.

    magic    8 bytes
    major    u16 BE
    minor    u16 BE
    length   u64 BE    payload length
    digest   32 bytes  sha256 of the payload
    payload  msgpack, exactly `length` bytes

Readers bound every size and refuse msgpack extension types, so a hostile file
can cost no more than its own size to reject.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from pathlib import Path
from typing import Any, BinaryIO, Callable

import msgpack

from portkern.base.records import frozen_record

HEADER = struct.Struct(">8sHHQ32s")
HEADER_SIZE = HEADER.size


@frozen_record
class Format:
    """One file format: its magic, version, limits and the errors it raises."""

    what: str
    magic: bytes
    major: int
    minor: int
    truncated: type[Exception]
    bad_magic: type[Exception]
    unsupported: type[Exception]
    digest: type[Exception]
    oversize: type[Exception]
    malformed: type[Exception]
    max_bin: int = 2 << 30
    max_str: int = 64 << 10
    max_items: int = 1 << 16

    @classmethod
    def with_error(cls, what: str, magic: bytes, major: int, minor: int, error: type[Exception]) -> "Format":
        """A format whose every failure raises the same error type."""
        return cls(what, magic, major, minor, error, error, error, error, error, error)


def pack(fmt: Format, document: Any) -> bytes:
    """Header + msgpack payload of `document` (maps keep their insertion order)."""
    payload = msgpack.packb(document, use_bin_type=True)
    return HEADER.pack(fmt.magic, fmt.major, fmt.minor, len(payload), hashlib.sha256(payload).digest()) + payload


def unpack(fmt: Format, data: bytes) -> tuple[tuple[int, int], str, Any]:
    """((major, minor), digest hex, decoded payload) of a framed file, or a typed error."""
    version, digest, document, end = unpack_prefix(fmt, data)
    if len(data) > end:
        raise fmt.malformed(f"{len(data) - end} unexpected bytes after the payload")
    return version, digest, document


def unpack_prefix(fmt: Format, data: bytes) -> tuple[tuple[int, int], str, Any, int]:
    """`unpack` of a file's first bytes, which may go on past the payload: also where the
    payload ends. The caller decides what may follow it."""
    magic = fmt.magic
    if len(data) < len(magic) or data[: len(magic)] != magic:
        if len(data) < len(magic) and magic.startswith(data):
            raise fmt.truncated(f"truncated: {len(data)} bytes, shorter than the {fmt.what} header")
        raise fmt.bad_magic(f"not a portkern {fmt.what} (wrong magic bytes)")
    if len(data) < HEADER_SIZE:
        raise fmt.truncated(f"truncated: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    _, major, minor, length, digest = HEADER.unpack_from(data)
    if major != fmt.major or minor > fmt.minor:
        raise fmt.unsupported(
            f"{fmt.what} format version {major}.{minor} is not supported "
            f"(this portkern reads {fmt.major}.0 to {fmt.major}.{fmt.minor})"
        )
    payload = memoryview(data)[HEADER_SIZE : HEADER_SIZE + length]
    if len(payload) < length:
        raise fmt.truncated(f"truncated: payload has {len(payload)} of {length} bytes")
    if hashlib.sha256(payload).digest() != digest:
        raise fmt.digest(f"{fmt.what} digest does not match its content (corrupted or modified)")
    return (major, minor), digest.hex(), _decode(fmt, payload), HEADER_SIZE + length


def meta_and_blobs(
    document: Any, schema: str, error: type[Exception], validate: bool = True
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A payload's `meta` (checked against the named JSON schema unless `validate` is
    False) and `blobs` (name -> bytes)."""
    from portkern.schemas import violations

    if not isinstance(document, dict) or set(document) != {"meta", "blobs"}:
        raise error("payload must be a map with exactly the keys 'meta' and 'blobs'")
    meta, blobs = document["meta"], document["blobs"]
    if not isinstance(blobs, dict) or not all(isinstance(v, bytes) for v in blobs.values()):
        raise error("'blobs' must map sha256 names to bytes")
    if not validate:
        return meta, blobs
    problems = violations(schema, meta)
    if problems:
        first = problems[0]
        raise error(f"metadata does not match the {schema} schema at {first.where}: {first.detail[:300]}")
    return meta, blobs


def _decode(fmt: Format, payload: memoryview) -> Any:
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=fmt.max_bin,
            max_str_len=fmt.max_str,
            max_array_len=fmt.max_items,
            max_map_len=fmt.max_items,
            max_ext_len=0,
        )
    except ValueError as exc:
        if "exceeds max" in str(exc):
            raise fmt.oversize(f"a field is larger than the reader allows ({exc})") from None
        raise fmt.malformed(f"payload is not valid msgpack ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: msgpack raises several unrelated types on bad input
        raise fmt.malformed(f"payload is not valid msgpack ({type(exc).__name__}: {exc})") from None


def file_sha256(f: BinaryIO, chunk: int = 1 << 20) -> str:
    """The sha256 hex digest of a binary file read from its position to its end, a chunk at a
    time (`hashlib.file_digest` needs Python 3.11)."""
    digest = hashlib.sha256()
    while block := f.read(chunk):
        digest.update(block)
    return digest.hexdigest()


def open_regular(path: str | Path, what: str, error: type[Exception], buffering: int = -1) -> tuple[BinaryIO, int]:
    """A regular file opened for reading, and its size; `error` for anything else (a device
    such as /dev/zero, whose size says nothing of what reading it gives; a named pipe, whose
    opening would wait for a writer: it is opened without waiting, then refused). OSError
    where it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: cannot read {what}: not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return open(fd, "rb", buffering=buffering), st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_bounded(
    path: str | Path, limit: int, what: str, error: type[Exception], oversize: type[Exception] | None = None, *, regular: bool = False
) -> bytes:
    """A file's bytes; `oversize` (default `error`) if it holds more than `limit` bytes,
    `error` if it cannot be read (or, with `regular`, is not a regular file). Never reads
    more than `limit` + 1 bytes, and nothing of a regular file larger than `limit`."""
    path = Path(path)
    try:
        if regular:
            f, size = open_regular(path, what, error)
        else:
            f = open(path, "rb")
            st = os.fstat(f.fileno())
            size = st.st_size if stat.S_ISREG(st.st_mode) else 0
        with f:
            if size > limit:
                raise (oversize or error)(f"{path}: larger than the {limit}-byte {what} limit")
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise (oversize or error)(f"{path}: larger than the {limit}-byte {what} limit")
    return data


def read_head(path: str | Path, magic: bytes, limit: int, round_to: int, what: str, error: type[Exception], oversize: type[Exception]) -> tuple[bytes, int]:
    """A framed file's header and payload, and the bytes after them up to the next multiple
    of `round_to` (what follows is the caller's to check), with the file's size. Never reads
    more than `limit` + 1 bytes; `oversize` if the part to read is larger than `limit`; `error`
    for what is not a regular file."""
    path = Path(path)
    try:
        f, size = open_regular(path, what, error)
        with f:
            head = f.read(HEADER_SIZE)
            want = size
            if len(head) == HEADER_SIZE and head[: len(magic)] == magic:
                length = HEADER.unpack(head)[3]
                want = min(size, -(-(HEADER_SIZE + length) // round_to) * round_to)
            if want > limit:
                raise oversize(f"{path}: larger than the {limit}-byte {what} limit")
            return head + f.read(want - len(head)), size
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None


def write_atomic(path: str | Path, data: bytes, error: type[Exception]) -> None:
    """Write a file whole or not at all (temp file in the same directory, then rename)."""
    write_atomic_with(path, lambda f: f.write(data), error)


def write_atomic_with(path: str | Path, write: Callable[[BinaryIO], object], error: type[Exception]) -> None:
    """`write_atomic` of what `write(file)` writes (it may seek). A character device or a pipe
    already at `path` (`-o /dev/null`, `/dev/stdout`) is written into, never replaced by a file;
    a block device or a socket there is refused."""
    import secrets  # (writers only: not on a reader's path)

    path = Path(path)
    kind = _special(path)
    if kind in ("block device", "socket"):  # (neither written into nor replaced)
        raise error(f"cannot write {path}: it is a {kind}")
    if kind:
        try:
            with open(path, "wb") as f:
                write(f)
        except OSError as exc:
            raise error(f"cannot write {path}: {exc.strerror or exc}") from None
        return
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise error(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _special(path: Path) -> str:
    """What `path` is when it is neither missing, a regular file nor a directory ("character
    device", "pipe", "block device", "socket"); "" otherwise."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    kinds = ((stat.S_ISCHR, "character device"), (stat.S_ISFIFO, "pipe"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))
    return next((name for test, name in kinds if test(mode)), "")
