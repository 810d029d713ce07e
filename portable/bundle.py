"""The `.pkb` bundle format (v1): reading, writing and the records it holds.

The file is framed by `portkern.portable.framing` with the magic `\\x89PKB\\r\\n\\x1a\\n`;
the framing's digest (sha256 of the payload) is the bundle digest. The
payload is `{"meta": <metadata, see schemas/bundle.schema.json>, "blobs":
{<sha256 hex>: <bytes>}}`; docs/bundle-format.md has the full description.

Metadata refers to every binary (MLIR bytecode, SPIR-V, native code) by the
sha256 of its bytes; the reader checks every blob against its name. Bundles
are untrusted input: nothing in them is executed, every size is bounded, and
names cannot contain path separators.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from portkern.portable import framing
from portkern.errors import (
    BadMagicError,
    BundleError,
    BundleTruncatedError,
    DigestMismatchError,
    MalformedBundleError,
    OversizeFieldError,
    UnsupportedVersionError,
)
from portkern.portable.contract import ShapeContract
from portkern.portable.producer import Producer

MAGIC = b"\x89PKB\r\n\x1a\n"
FORMAT_MAJOR = 1
#: The newest minor version this portkern reads. It writes the oldest one that holds the bundle:
#: 1.1 when a kernel has a source stage (phase `start`, docs/bundle-format.md), else 1.0.
FORMAT_MINOR = 1
#: The first minor version with source stages.
SOURCE_MINOR = 1
#: The phase of a source stage: the kernel as written, not lowered at all.
SOURCE_PHASE = "start"
HEADER_SIZE = framing.HEADER_SIZE

#: Reader limits. A bundle over any of them is refused with OversizeFieldError.
MAX_BUNDLE_BYTES = 4 << 30
MAX_BLOB_BYTES = 2 << 30
MAX_STRING_BYTES = 64 << 10
MAX_ITEMS = 1 << 16


@dataclass(frozen=True)
class TensorSpec:
    """Shape (None for a dynamic dimension) and NumPy dtype name of one tensor."""

    shape: tuple[int | None, ...]
    dtype: str

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: Mapping) -> "TensorSpec":
        return cls(tuple(data["shape"]), data["dtype"])

    def __str__(self) -> str:
        dims = "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{dims}x{self.dtype}" if dims else self.dtype


@dataclass(frozen=True)
class Signature:
    """Arguments and results of a kernel's entry function, and the shape contract that ties
    their dimensions together (None when it could be neither derived nor stated)."""

    inputs: tuple[TensorSpec, ...]
    results: tuple[TensorSpec, ...]
    contract: ShapeContract | None = None

    def to_dict(self) -> dict:
        data = {"inputs": [t.to_dict() for t in self.inputs], "results": [t.to_dict() for t in self.results]}
        if self.contract is not None:
            data["contract"] = self.contract.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "Signature":
        signature = cls(
            tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
            tuple(TensorSpec.from_dict(t) for t in data["results"]),
        )
        if "contract" not in data:
            return signature
        contract = ShapeContract.from_dict(data["contract"])
        problem = contract.problem([t.shape for t in signature.inputs], [t.shape for t in signature.results])
        if problem is not None:
            raise MalformedBundleError(f"shape contract {contract} does not fit the signature {signature}: {problem}")
        return cls(signature.inputs, signature.results, contract)

    @property
    def contract_text(self) -> str:
        """The contract as `(MxK, KxN) -> MxN`, or why calls are not checked."""
        return str(self.contract) if self.contract is not None else "unchecked (no shape contract)"

    def __str__(self) -> str:
        return f"({', '.join(map(str, self.inputs))}) -> ({', '.join(map(str, self.results))})"


@dataclass(frozen=True)
class Stage:
    """A portable (not yet native) form of a kernel, stored as a blob."""

    #: The IREE phase it was lowered to ("flow", "executable-sources"), or "spirv" / "spir".
    phase: str
    #: Device family it is specific to: "any", or e.g. "amdgpu" for a placeholder-arch stage.
    family: str
    #: "mlir-bytecode", "spirv", or "spir-bitcode" (SPIR 1.2, for OpenCL drivers without SPIR-V IL).
    format: str
    blob: str
    size: int
    producer: Producer
    #: The placeholder target a family stage was lowered for, to be swapped on the device.
    placeholder: str | None = None
    #: A source stage of an ONNX model: its `opset` and `ir_version`.
    model: Mapping[str, int] | None = None

    @property
    def is_source(self) -> bool:
        """Whether this is the kernel's source stage (read by any IREE release that parses it)."""
        return self.phase == SOURCE_PHASE

    def to_dict(self) -> dict:
        data = {
            "phase": self.phase,
            "family": self.family,
            "format": self.format,
            "blob": self.blob,
            "size": self.size,
            "producer": self.producer.to_dict(),
        }
        if self.placeholder is not None:
            data["placeholder"] = self.placeholder
        if self.model is not None:
            data["model"] = dict(self.model)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "Stage":
        return cls(
            data["phase"],
            data["family"],
            data["format"],
            data["blob"],
            data["size"],
            Producer.from_dict(data["producer"]),
            data.get("placeholder"),
            data.get("model"),
        )


@dataclass(frozen=True)
class NativeArtifact:
    """Native code prebuilt for one target (a fat-binary slice)."""

    #: Target label, e.g. "cpu:znver4" or "amdgpu:gfx942".
    target: str
    #: "vmfb" or an OpenCL program binary format.
    format: str
    blob: str
    size: int
    #: The device fingerprint (as plain data) the code was built for.
    device: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"target": self.target, "format": self.format, "blob": self.blob, "size": self.size, "device": dict(self.device)}

    @classmethod
    def from_dict(cls, data: Mapping) -> "NativeArtifact":
        return cls(data["target"], data["format"], data["blob"], data["size"], data.get("device", {}))


@dataclass(frozen=True)
class KernelRecord:
    """Everything a bundle holds about one kernel."""

    name: str
    kind: str
    entry: str
    signature: Signature
    stages: tuple[Stage, ...]
    source_sha256: str
    native: tuple[NativeArtifact, ...] = ()
    #: Kind-specific launch description (OpenCL: arguments, sizes); empty for MLIR.
    launch: Mapping[str, Any] = field(default_factory=dict)

    def stage(self, family: str = "any") -> Stage:
        """The stage to finalise for a device family: the family's own stage if
        there is one, else the device-independent one (never the source stage)."""
        for wanted in dict.fromkeys((family, "any")):
            for stage in self.stages:
                if stage.family == wanted and not stage.is_source:
                    return stage
        have = ", ".join(f"{s.family}/{s.phase}" for s in self.stages)
        raise BundleError(f"kernel {self.name!r} has no {family!r} stage (it has: {have})")

    def source_stage(self) -> Stage | None:
        """The kernel's source stage, None when it was built without one (`portkern build --no-source`)."""
        return next((stage for stage in self.stages if stage.is_source), None)

    def to_dict(self) -> dict:
        data = {
            "name": self.name,
            "kind": self.kind,
            "entry": self.entry,
            "signature": self.signature.to_dict(),
            "stages": [s.to_dict() for s in self.stages],
            "source_sha256": self.source_sha256,
            "native": [n.to_dict() for n in self.native],
        }
        if self.launch:
            data["launch"] = dict(self.launch)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "KernelRecord":
        return cls(
            data["name"],
            data["kind"],
            data["entry"],
            Signature.from_dict(data["signature"]),
            tuple(Stage.from_dict(s) for s in data["stages"]),
            data["source_sha256"],
            tuple(NativeArtifact.from_dict(n) for n in data.get("native", ())),
            data.get("launch", {}),
        )


@dataclass(frozen=True)
class Bundle:
    """A bundle's contents: named kernels and the blobs they refer to."""

    name: str
    kernels: tuple[KernelRecord, ...]
    blobs: Mapping[str, bytes]
    #: sha256 of the payload, hex; set when read from or written to a file.
    digest: str = ""
    version: tuple[int, int] = (FORMAT_MAJOR, 0)

    def kernel(self, name: str) -> KernelRecord:
        from portkern.errors import KernelNotFoundError, did_you_mean

        for record in self.kernels:
            if record.name == name:
                return record
        names = [k.name for k in self.kernels]
        hint = did_you_mean(name, names)
        raise KernelNotFoundError(f"bundle {self.name!r} has no kernel {name!r}{hint} (it has: {', '.join(names) or 'none'})")

    def blob(self, sha: str) -> bytes:
        return self.blobs[sha]

    def written_version(self) -> tuple[int, int]:
        """The oldest format version that holds this bundle (what `encode` writes)."""
        with_source = any(stage.is_source for record in self.kernels for stage in record.stages)
        return (FORMAT_MAJOR, SOURCE_MINOR if with_source else 0)

    def meta(self) -> dict:
        return {
            "format": "portkern-bundle",
            "version": list(self.written_version()),
            "name": self.name,
            "kernels": [k.to_dict() for k in self.kernels],
        }


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(bundle: Bundle) -> bytes:
    """The bundle's bytes. Equal contents give equal bytes."""
    blobs = {sha: bundle.blobs[sha] for sha in sorted(bundle.blobs)}
    return framing.pack(_format(bundle.written_version()[1]), {"meta": bundle.meta(), "blobs": blobs})


def write_bundle(bundle: Bundle, path: str | Path, check: Callable[[bytes], object] | None = None) -> str:
    """Write atomically (temp file + rename), after `check(bytes)` (if given) has passed;
    return the bundle digest."""
    data = encode(bundle)
    if check is not None:
        check(data)
    framing.write_atomic(path, data, BundleError)
    return data[HEADER_SIZE - 32 : HEADER_SIZE].hex()


def read_bundle(path: str | Path, validated: Callable[[str], bool] | None = None) -> Bundle:
    """Read and check a bundle file; raise a `BundleError` subclass if it is not sound.

    `validated(digest)` may say that a payload with this digest already passed
    the schema check (the digest itself is always verified), to skip repeating it.
    """
    return decode_file(path, read_bundle_bytes(path), validated)


def read_bundle_bytes(path: str | Path) -> bytes:
    """A bundle file's bytes, read once and bounded, not yet checked."""
    return framing.read_bounded(path, MAX_BUNDLE_BYTES, "bundle", BundleError, OversizeFieldError)


def decode_file(path: str | Path, data: bytes, validated: Callable[[str], bool] | None = None) -> Bundle:
    """`decode`, with errors naming the file the bytes came from."""
    try:
        return decode(data, validated)
    except BundleError as exc:
        raise type(exc)(f"{path}: {exc}") from None


def _format(minor: int = FORMAT_MINOR) -> framing.Format:
    """The bundle file format (written as `minor`; read up to `FORMAT_MINOR`), with the reader limits as they are now."""
    return framing.Format(
        "bundle",
        MAGIC,
        FORMAT_MAJOR,
        minor,
        truncated=BundleTruncatedError,
        bad_magic=BadMagicError,
        unsupported=UnsupportedVersionError,
        digest=DigestMismatchError,
        oversize=OversizeFieldError,
        malformed=MalformedBundleError,
        max_bin=MAX_BLOB_BYTES,
        max_str=MAX_STRING_BYTES,
        max_items=MAX_ITEMS,
    )


def decode(data: bytes, validated: Callable[[str], bool] | None = None) -> Bundle:
    """Parse and check bundle bytes (see `read_bundle` for `validated`)."""
    version, digest, document = framing.unpack(_format(), data)
    skip = validated is not None and validated(digest)
    meta, blobs = framing.meta_and_blobs(document, "bundle", MalformedBundleError, validate=not skip)
    _check_names(meta)
    _check_blobs(meta, blobs)
    if version[1] < SOURCE_MINOR and any(stage.get("phase") == SOURCE_PHASE for k in meta["kernels"] for stage in k["stages"]):
        raise MalformedBundleError(f"source stages need format 1.{SOURCE_MINOR}; the header says {version[0]}.{version[1]}")
    return Bundle(
        meta["name"],
        tuple(KernelRecord.from_dict(k) for k in meta["kernels"]),
        blobs,
        digest,
        version,
    )


def _check_names(meta: dict) -> None:
    names = [k["name"] for k in meta["kernels"]]
    if len(names) != len(set(names)):
        raise MalformedBundleError("two kernels share a name")


def _check_blobs(meta: dict, blobs: dict[str, bytes]) -> None:
    referenced: dict[str, int] = {}
    for kernel in meta["kernels"]:
        for item in list(kernel["stages"]) + list(kernel.get("native", ())):
            referenced[item["blob"]] = item["size"]
    missing = sorted(set(referenced) - set(blobs))
    if missing:
        raise MalformedBundleError(f"metadata refers to missing blob {missing[0][:16]}...")
    unused = sorted(set(blobs) - set(referenced))
    if unused:
        raise MalformedBundleError(f"blob {unused[0][:16]}... is not referenced by any kernel")
    for sha, blob in blobs.items():
        if len(blob) != referenced[sha]:
            raise MalformedBundleError(f"blob {sha[:16]}... has {len(blob)} bytes, metadata says {referenced[sha]}")
        if hashlib.sha256(blob).hexdigest() != sha:
            raise DigestMismatchError(f"blob {sha[:16]}... does not hash to its name")
