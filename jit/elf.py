"""Reading ELF64 images embedded in native code (untrusted bytes): headers, sections, notes.

Only what checking a GPU code object needs. Every offset and count is checked
against the bytes at hand and a fixed limit before it is used; anything that
does not add up is `ElfFormatError` (a ValueError), never a crash.
"""

from __future__ import annotations

import struct

from portkern.base.records import frozen_record

MAGIC = b"\x7fELF"
_IDENT = struct.Struct("<4sBBBBB")  # magic, class, data, version, osabi, abiversion
_HEADER = struct.Struct("<HHIQQQIHHHHHH")  # from offset 16
_SECTION = struct.Struct("<IIQQQQIIQQ")
_NOTE = struct.Struct("<III")
_HEADER_SIZE = 64
ELFCLASS64 = 2
ELFDATA2LSB = 1
SHT_NOTE = 7
SHT_NOBITS = 8
EM_X86_64 = 62
EM_AARCH64 = 183
#: `e_machine` -> the architecture's name, for the machines portkern builds code for.
MACHINES = {EM_X86_64: "x86-64", EM_AARCH64: "aarch64", 224: "amdgpu"}

#: Limits: images kept and magic numbers tried per blob, sections per image, notes per section.
MAX_IMAGES = 256
MAX_CANDIDATES = 4096
MAX_SECTIONS = 4096
MAX_NOTES = 1024


class ElfFormatError(ValueError):
    """The bytes are not a well-formed ELF64 little-endian image."""


@frozen_record
class Note:
    """One ELF note: owner name, type and descriptor bytes."""

    name: str
    type: int
    desc: bytes


@frozen_record
class Image:
    """An ELF64 image found at `offset` in a larger blob."""

    offset: int
    size: int
    machine: int
    osabi: int
    abi_version: int
    flags: int
    notes: tuple[Note, ...]


def parse(data: bytes | memoryview, offset: int = 0) -> Image:
    """The ELF64 little-endian image starting at `offset` in `data`."""
    view = memoryview(data)[offset:]
    if len(view) < _HEADER_SIZE:
        raise ElfFormatError("shorter than an ELF64 header")
    magic, cls, order, _version, osabi, abi_version = _IDENT.unpack_from(view, 0)
    if magic != MAGIC:
        raise ElfFormatError("no ELF magic")
    if cls != ELFCLASS64 or order != ELFDATA2LSB:
        raise ElfFormatError("not ELF64 little-endian")
    (_type, machine, _ver, _entry, phoff, shoff, flags, ehsize, phentsize, phnum, shentsize, shnum, shstrndx) = (
        _HEADER.unpack_from(view, 16)
    )
    del shstrndx
    if ehsize < _HEADER_SIZE:
        raise ElfFormatError(f"header size {ehsize} is too small")
    size = max(ehsize, phoff + phnum * phentsize if phnum else 0)
    sections = []
    if shnum:
        if shentsize != _SECTION.size:
            raise ElfFormatError(f"section header size {shentsize}, expected {_SECTION.size}")
        if shnum > MAX_SECTIONS:
            raise ElfFormatError(f"{shnum} sections is more than {MAX_SECTIONS}")
        size = max(size, shoff + shnum * shentsize)
        if size > len(view):
            raise ElfFormatError(f"needs {size} bytes, {len(view)} available")
        for index in range(shnum):
            _name, kind, _flags, _addr, sh_offset, sh_size, *_ = _SECTION.unpack_from(view, shoff + index * shentsize)
            if kind != SHT_NOBITS:
                if sh_offset + sh_size > len(view):
                    raise ElfFormatError(f"section {index} ends past the available bytes")
                size = max(size, sh_offset + sh_size)
            sections.append((kind, sh_offset, sh_size))
    if size > len(view):
        raise ElfFormatError(f"needs {size} bytes, {len(view)} available")
    notes: list[Note] = []
    for kind, sh_offset, sh_size in sections:
        if kind == SHT_NOTE:
            notes.extend(_notes(view[sh_offset : sh_offset + sh_size]))
    return Image(offset, size, machine, osabi, abi_version, flags, tuple(notes))


def _notes(section: memoryview) -> list[Note]:
    notes: list[Note] = []
    pos = 0
    while pos + _NOTE.size <= len(section):
        if len(notes) >= MAX_NOTES:
            raise ElfFormatError(f"more than {MAX_NOTES} notes in one section")
        namesz, descsz, kind = _NOTE.unpack_from(section, pos)
        pos += _NOTE.size
        name_end = pos + namesz
        desc_start = pos + _align4(namesz)
        desc_end = desc_start + descsz
        if desc_end > len(section):
            raise ElfFormatError("note runs past its section")
        name = bytes(section[pos:name_end]).rstrip(b"\0").decode("ascii", "replace")
        notes.append(Note(name, kind, bytes(section[desc_start:desc_end])))
        pos = desc_start + _align4(descsz)
    return notes


def _align4(n: int) -> int:
    return (n + 3) & ~3


def find(data: bytes) -> list[Image]:
    """Every well-formed ELF64 little-endian image embedded in `data`, in order."""
    images: list[Image] = []
    pos = 0
    for _ in range(MAX_CANDIDATES):
        if len(images) >= MAX_IMAGES:
            break
        start = data.find(MAGIC, pos)
        if start < 0:
            break
        try:
            image = parse(data, start)
        except (ElfFormatError, struct.error):
            pos = start + len(MAGIC)
            continue
        images.append(image)
        pos = start + max(image.size, len(MAGIC))
    return images
