"""The code-object check reads untrusted bytes: damaged or forged input is refused, never a crash."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest

from portkern.base.errors import CodeObjectError
from portkern.jit import codeobject, elf
from portkern.jit.devices import resolve


@pytest.fixture(scope="module")
def gfx942(gpu_native) -> bytes:
    return gpu_native("gfx942")


def _image(vmfb: bytes) -> tuple[int, bytearray]:
    (found,) = elf.find(vmfb)
    return found.offset, bytearray(vmfb[found.offset : found.offset + found.size])


def test_real_code_object_parses(gfx942):
    offset, image = _image(gfx942)
    parsed = elf.parse(bytes(image))
    assert (parsed.machine, parsed.osabi, parsed.flags & 0xFF) == (224, 64, 0x4C)
    assert any(n.name == "AMDGPU" and n.type == codeobject.NT_AMDGPU_METADATA for n in parsed.notes)


def test_truncated_code_is_refused(gfx942):
    offset, image = _image(gfx942)
    fingerprint = resolve("gfx942").fingerprint
    for cut in (offset + 10, offset + 64, offset + len(image) // 2, offset + len(image) - 1):
        with pytest.raises(CodeObjectError, match="no AMD code object found"):
            codeobject.check(gfx942[:cut], fingerprint)


def test_random_and_forged_bytes_do_not_crash():
    rng = np.random.default_rng(7)
    for _ in range(200):
        blob = bytearray(rng.integers(0, 256, int(rng.integers(0, 400)), dtype=np.uint8).tobytes())
        blob[: len(elf.MAGIC) + 2] = elf.MAGIC + b"\x02\x01"  # look like ELF64 LE to reach the header checks
        assert codeobject.inspect(bytes(blob) * 3).amdgpu == ()
    header = bytearray(64)
    header[:6] = elf.MAGIC + b"\x02\x01"
    struct.pack_into("<HHIQQQIHHHHHH", header, 16, 1, 224, 1, 0, 0, 64, 0x4C, 64, 0, 0, 64, 0xFFFF, 0)
    with pytest.raises(elf.ElfFormatError, match="65535 sections is more than"):
        elf.parse(bytes(header))
    struct.pack_into("<HHIQQQIHHHHHH", header, 16, 1, 224, 1, 0, 0, 1 << 60, 0x4C, 64, 0, 0, 64, 2, 0)
    with pytest.raises(elf.ElfFormatError, match="available"):
        elf.parse(bytes(header))


def test_header_and_metadata_must_both_name_the_arch(gfx942):
    offset, image = _image(gfx942)
    fingerprint = resolve("gfx942").fingerprint
    flags_at = 48  # e_flags in the ELF64 header
    forged = bytearray(image)
    struct.pack_into("<I", forged, flags_at, (struct.unpack_from("<I", forged, flags_at)[0] & ~0xFF) | 0x3F)  # gfx90a
    with pytest.raises(CodeObjectError, match="code object for gfx90a .*expected gfx942"):
        codeobject.check(gfx942[:offset] + bytes(forged) + gfx942[offset + len(image) :], fingerprint)

    note = next(n for n in elf.parse(bytes(image)).notes if n.type == codeobject.NT_AMDGPU_METADATA)
    metadata = msgpack.unpackb(note.desc, strict_map_key=False)
    metadata["amdhsa.target"] = metadata["amdhsa.target"].replace("gfx942", "gfx950")
    desc = msgpack.packb(metadata)
    assert len(desc) == len(note.desc)  # same length: only the arch changed
    at = bytes(image).index(note.desc)
    forged = bytes(image[:at]) + desc + bytes(image[at + len(desc) :])
    with pytest.raises(CodeObjectError, match=r"code object for gfx942 \(metadata: .*gfx950\), expected gfx942"):
        codeobject.check(gfx942[:offset] + forged + gfx942[offset + len(image) :], fingerprint)

    garbled = bytes(image[:at]) + b"\xc1" * len(desc) + bytes(image[at + len(desc) :])
    with pytest.raises(CodeObjectError, match=r"metadata: none"):
        codeobject.check(gfx942[:offset] + garbled + gfx942[offset + len(image) :], fingerprint)


def test_cpu_code_is_not_checked_as_gpu_code(gfx942):
    assert codeobject.problem(gfx942, resolve("cpu").fingerprint) is None
    assert codeobject.problem(b"", resolve("cuda:sm_80").fingerprint) == "no PTX found (no device code)"
