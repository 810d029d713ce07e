"""The .pkb reader: round trips, and refuses every kind of bad file with a typed error."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace

import msgpack
import pytest

from portkern.base.errors import (
    BadMagicError,
    BundleTruncatedError,
    DigestMismatchError,
    IncompatibleProducerError,
    MalformedBundleError,
    OversizeFieldError,
    UnsupportedVersionError,
)
from portkern.portable import bundle as fmt
from portkern.portable.bundle import decode, encode, read_bundle
from portkern.portable.producer import Producer


def repack(meta: dict, blobs: dict, major: int = fmt.FORMAT_MAJOR, minor: int = fmt.FORMAT_MINOR) -> bytes:
    """A well-formed file (right digest) around any payload, to test the checks behind the digest."""
    payload = msgpack.packb({"meta": meta, "blobs": blobs}, use_bin_type=True)
    return struct.pack(">8sHHQ32s", fmt.MAGIC, major, minor, len(payload), hashlib.sha256(payload).digest()) + payload


@pytest.fixture(scope="module")
def good(examples_bundle):
    """A format 1.0 bundle: the examples without the kernel that has parameters (format 1.1:
    tests/test_parameters.py) and without source stages (format 1.2: tests/test_source_stage.py)."""
    full = decode(examples_bundle.read_bytes())
    kernels = tuple(replace(k, stages=tuple(s for s in k.stages if not s.is_source)) for k in full.kernels if not k.parameters)
    used = {item.blob for k in kernels for item in (*k.stages, *k.native)}
    plain = replace(full, kernels=kernels, blobs={sha: b for sha, b in full.blobs.items() if sha in used}, parameters=None)
    data = encode(plain)
    return data, decode(data)


def test_examples_round_trip_is_byte_identical(examples_bundle):
    data = examples_bundle.read_bytes()
    bundle = decode(data)
    assert bundle.version == (1, 2) and bundle.parameters is not None
    head = encode(bundle)
    assert data[: len(head)] == head and len(data) == bundle.parameters.offset + bundle.parameters.size


def test_round_trip_is_byte_identical(good):
    data, bundle = good
    assert encode(bundle) == data and bundle.version == (1, 0)
    assert bundle.digest == hashlib.sha256(data[fmt.HEADER_SIZE :]).hexdigest()
    assert [k.name for k in bundle.kernels] == ["gemm_bias_relu", "gemm_glu", "gemm_rowsum", "gemm_transpose_add"]
    stage = bundle.kernel("gemm_glu").stage()
    assert stage.phase == "flow" and stage.format == "mlir-bytecode"
    assert stage.producer.compiler == "iree" and stage.producer.bytecode_version == 6
    assert bundle.blob(stage.blob)[:4] == b"ML\xefR"


@pytest.mark.parametrize("keep", [0, 5, fmt.HEADER_SIZE - 1])
def test_truncated_header(good, keep):
    with pytest.raises(BundleTruncatedError, match="truncated"):
        decode(good[0][:keep])


def test_truncated_payload(good):
    with pytest.raises(BundleTruncatedError, match=r"truncated: payload has \d+ of \d+ bytes"):
        decode(good[0][:-100])


def test_wrong_magic(good):
    with pytest.raises(BadMagicError, match="not a portkern bundle"):
        decode(b"PK\x03\x04" + good[0][4:])


def test_unknown_major_version(good):
    data = bytearray(good[0])
    struct.pack_into(">H", data, 8, 2)
    with pytest.raises(UnsupportedVersionError, match=r"format version 2\.0 is not supported"):
        decode(bytes(data))


def test_newer_minor_version(good):
    data = bytearray(good[0])
    struct.pack_into(">H", data, 10, fmt.FORMAT_MINOR + 1)
    with pytest.raises(UnsupportedVersionError, match=rf"1\.{fmt.FORMAT_MINOR + 1} is not supported"):
        decode(bytes(data))


def test_digest_mismatch(good):
    data = bytearray(good[0])
    data[-10] ^= 0xFF
    with pytest.raises(DigestMismatchError, match="digest does not match"):
        decode(bytes(data))


def test_trailing_bytes(good):
    with pytest.raises(MalformedBundleError, match="unexpected bytes after the payload"):
        decode(good[0] + b"x")


def test_oversize_string_field(good):
    meta = good[1].meta()
    meta["name"] = "x" * (fmt.MAX_STRING_BYTES + 1)
    with pytest.raises(OversizeFieldError, match="larger than the reader allows"):
        decode(repack(meta, dict(good[1].blobs)))


def test_oversize_blob(good, monkeypatch):
    monkeypatch.setattr(fmt, "MAX_BLOB_BYTES", 1000)
    with pytest.raises(OversizeFieldError, match="max_bin_len"):
        decode(good[0])


def test_oversize_file(examples_bundle, monkeypatch):
    monkeypatch.setattr(fmt, "MAX_BUNDLE_BYTES", 100)
    with pytest.raises(OversizeFieldError, match="bundle limit"):
        read_bundle(examples_bundle)


def test_schema_violation_path_escape_in_name(good):
    meta = good[1].meta()
    meta["kernels"][0]["name"] = "../../etc/passwd"
    with pytest.raises(MalformedBundleError, match="kernels/0/name"):
        decode(repack(meta, dict(good[1].blobs)))


def test_unknown_metadata_key(good):
    meta = good[1].meta()
    meta["kernels"][0]["exec"] = "rm -rf /"
    with pytest.raises(MalformedBundleError, match="bundle schema"):
        decode(repack(meta, dict(good[1].blobs)))


def test_msgpack_extension_types_are_refused(good):
    payload = msgpack.packb({"meta": msgpack.ExtType(1, b"pickle?"), "blobs": {}}, use_bin_type=True)
    data = struct.pack(">8sHHQ32s", fmt.MAGIC, 1, 0, len(payload), hashlib.sha256(payload).digest()) + payload
    with pytest.raises((MalformedBundleError, OversizeFieldError)):
        decode(data)


def test_blob_that_does_not_hash_to_its_name(good):
    blobs = dict(good[1].blobs)
    sha = next(iter(blobs))
    blobs[sha] = bytes(len(blobs[sha]))
    with pytest.raises(DigestMismatchError, match="does not hash to its name"):
        decode(repack(good[1].meta(), blobs))


def test_missing_and_unreferenced_blobs(good):
    blobs = dict(good[1].blobs)
    sha = next(iter(blobs))
    del blobs[sha]
    with pytest.raises(MalformedBundleError, match="missing blob"):
        decode(repack(good[1].meta(), blobs))
    blobs = dict(good[1].blobs)
    blobs["0" * 64] = b"stowaway"
    with pytest.raises(MalformedBundleError, match="not referenced"):
        decode(repack(good[1].meta(), blobs))


def test_not_msgpack(good):
    payload = b"\xc1" * 16
    data = struct.pack(">8sHHQ32s", fmt.MAGIC, 1, 0, len(payload), hashlib.sha256(payload).digest()) + payload
    with pytest.raises(MalformedBundleError, match="not valid msgpack"):
        decode(data)


def _with_producer(good, **changes) -> bytes:
    """The bundle with its producer records changed, as built with `--no-source` (a kernel's source
    stage would serve another release: tests/test_source_stage.py)."""
    meta = good[1].meta()
    blobs = dict(good[1].blobs)
    for kernel in meta["kernels"]:
        for stage in [s for s in kernel["stages"] if s["phase"] == fmt.SOURCE_PHASE]:
            kernel["stages"].remove(stage)
            blobs.pop(stage["blob"])
        for stage in kernel["stages"]:
            stage["producer"].update(changes)
    meta["version"] = [1, 0]
    return repack(meta, blobs, minor=0)


def test_bundle_from_another_iree_release_is_refused_at_load(good, tmp_path):
    import portkern

    path = tmp_path / "old.pkb"
    path.write_bytes(_with_producer(good, version="3.9.0"))
    with pytest.raises(IncompatibleProducerError, match=r"built with IREE 3\.9\.0, but IREE 3\.13"):
        portkern.load(path)


def test_bytecode_newer_than_the_compiler_reads_is_refused(good, tmp_path, store):
    import portkern

    path = tmp_path / "future.pkb"
    path.write_bytes(_with_producer(good, bytecode_version=99))
    bundle = portkern.load(path, store=store)
    with pytest.raises(IncompatibleProducerError, match=r"bytecode version 99 is newer than the installed compiler reads \(up to 6\)"):
        bundle.kernel("gemm_bias_relu")


def test_unknown_producer_compiler(good, tmp_path):
    import portkern

    path = tmp_path / "other.pkb"
    path.write_bytes(_with_producer(good, compiler="tvm"))
    with pytest.raises(IncompatibleProducerError, match="unknown producer compiler 'tvm'"):
        portkern.load(path)


def test_producer_record_round_trips():
    producer = Producer("iree", "3.13.0", "abc", 6)
    assert Producer.from_dict(producer.to_dict()) == producer
