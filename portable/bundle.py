"""The `.pkb` bundle format (v1): reading, writing and the records it holds.

The file is framed by `portkern.base.framing` with the magic `\\x89PKB\\r\\n\\x1a\\n`;
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
from dataclasses import field, replace
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

from portkern.base import framing
from portkern.base.errors import (
    ArgumentTypeError,
    BadMagicError,
    BundleError,
    BundleTruncatedError,
    DigestMismatchError,
    MalformedBundleError,
    OversizeFieldError,
    UnsupportedVersionError,
)
from portkern.base.records import from_plain, frozen_record, to_plain, wire
from portkern.portable.contract import ShapeContract
from portkern.portable.parameters import (
    CHUNK_BYTES,
    SECTION_ALIGNMENT,
    Parameter,
    ParameterData,
    ParameterSection,
    check_file_size,
    check_layout,
    layout,
    section_offset,
    write_section,
)
from portkern.portable.producer import Producer

MAGIC = b"\x89PKB\r\n\x1a\n"
FORMAT_MAJOR = 1
#: The newest minor version this portkern reads. It writes the oldest one that holds the bundle:
#: 1.4 when a contract has conditions or result expressions (`ShapeContract.has_expressions`),
#: else 1.3 when a contract's argument names are free text (`ShapeContract.free_names`), else 1.2 when
#: a kernel has a source stage (phase `start`), else 1.1 when there is a parameter section, else
#: 1.0 (docs/bundle-format.md).
FORMAT_MINOR = 4
#: The first minor version with a parameter section.
PARAMETERS_MINOR = 1
#: The first minor version with source stages.
SOURCE_MINOR = 2
#: The first minor version with free-text argument names (and their identifiers) in contracts.
NAMES_MINOR = 3
#: The first minor version with conditions (`requires`) and result expressions in contracts.
EXPRESSIONS_MINOR = 4
#: The phase of a source stage: the kernel as written, not lowered at all.
SOURCE_PHASE = "start"
#: Kernel kinds whose sources are lowered to MLIR stages for IREE (others: OpenCL C, SPIR-V).
IREE_KINDS = ("mlir", "onnx", "torch")
HEADER_SIZE = framing.HEADER_SIZE

#: Reader limits. A bundle over any of them is refused with OversizeFieldError.
#: (MAX_BUNDLE_BYTES bounds the header and payload; a parameter section is bounded by
#: `portable.parameters.MAX_SECTION_BYTES`.)
MAX_BUNDLE_BYTES = 4 << 30
MAX_BLOB_BYTES = 2 << 30
MAX_STRING_BYTES = 64 << 10
MAX_ITEMS = 1 << 16


@frozen_record
class TensorSpec:
    """Shape (None for a dynamic dimension) and NumPy dtype name of one tensor."""

    shape: tuple[int | None, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TensorSpec":
        return from_plain(cls, data)

    def __str__(self) -> str:
        dims = "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{dims}x{self.dtype}" if dims else self.dtype


@frozen_record
class Signature:
    """Arguments and results of a kernel's entry function, and the shape contract that ties
    their dimensions together (None when it could be neither derived nor stated)."""

    inputs: tuple[TensorSpec, ...]
    results: tuple[TensorSpec, ...]
    contract: ShapeContract | None = field(default=None, metadata=wire(omit=True))

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Signature":
        """A signature from a bundle record (already schema-checked); MalformedBundleError when its
        shape contract does not fit its shapes."""
        signature = from_plain(cls, data)
        contract = signature.contract
        if contract is not None:
            problem = contract.problem([t.shape for t in signature.inputs], [t.shape for t in signature.results])
            if problem is not None:
                raise MalformedBundleError(f"shape contract {contract} does not fit the signature {signature}: {problem}")
        return signature

    @property
    def contract_text(self) -> str:
        """The contract as `(MxK, KxN) -> MxN`, or why calls are not checked."""
        return str(self.contract) if self.contract is not None else "unchecked (no shape contract)"

    def __str__(self) -> str:
        return f"({', '.join(map(str, self.inputs))}) -> ({', '.join(map(str, self.results))})"


@frozen_record
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
    placeholder: str | None = field(default=None, metadata=wire(omit=True))
    #: A source stage of an ONNX model: its `opset` and `ir_version`.
    model: Mapping[str, int] | None = field(default=None, metadata=wire(omit=True))

    @property
    def is_source(self) -> bool:
        """Whether this is the kernel's source stage (read by any IREE release that parses it)."""
        return self.phase == SOURCE_PHASE

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Stage":
        return from_plain(cls, data)


@frozen_record
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

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NativeArtifact":
        return from_plain(cls, data)


@frozen_record
class KernelRecord:
    """Everything a bundle holds about one kernel."""

    name: str
    kind: str
    entry: str
    #: Read with `Signature.from_dict` (which checks the shape contract against the shapes).
    signature: Signature = field(metadata=wire(decode=lambda data: Signature.from_dict(data)))
    stages: tuple[Stage, ...]
    source_sha256: str
    native: tuple[NativeArtifact, ...] = ()
    #: Kind-specific launch description (OpenCL: arguments, sizes); empty for MLIR.
    launch: Mapping[str, Any] = field(default_factory=dict, metadata=wire(omit=True))
    #: Named parameters (weights) its stages refer to, in the bundle's parameter section.
    parameters: tuple[Parameter, ...] = field(default=(), metadata=wire(omit=True))

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

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KernelRecord":
        """A kernel record from bundle metadata (already schema-checked), its signature checked
        (`Signature.from_dict`)."""
        return from_plain(cls, data)


@frozen_record
class Bundle:
    """A bundle's contents: named kernels and the blobs they refer to."""

    name: str
    kernels: tuple[KernelRecord, ...]
    blobs: Mapping[str, bytes]
    #: sha256 of the payload, hex; set when read from or written to a file.
    digest: str = ""
    version: tuple[int, int] = (FORMAT_MAJOR, 0)
    #: Where the parameter section lies in the file the bundle was read from (None: none).
    parameters: ParameterSection | None = None
    #: Build side only: parameters still to be written, streamed into the file by `write_bundle`.
    parameter_data: tuple[ParameterData, ...] = ()

    def kernel(self, name: str) -> KernelRecord:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"a kernel is named by a str, got {type(name).__name__}")
        for record in self.kernels:
            if record.name == name:
                return record
        from portkern.base.errors import KernelNotFoundError, did_you_mean

        names = [k.name for k in self.kernels]
        hint = did_you_mean(name, names)
        raise KernelNotFoundError(f"bundle {self.name!r} has no kernel {name!r}{hint} (it has: {', '.join(names) or 'none'})")

    def blob(self, sha: str) -> bytes:
        return self.blobs[sha]

    def written_version(self) -> tuple[int, int]:
        """The oldest format version that holds this bundle (what `encode` writes)."""
        with_source = any(stage.is_source for record in self.kernels for stage in record.stages)
        with_parameters = self.parameters is not None or bool(self.parameter_data)
        if any(record.signature.contract is not None and record.signature.contract.has_expressions for record in self.kernels):
            return (FORMAT_MAJOR, EXPRESSIONS_MINOR)
        if any(record.signature.contract is not None and record.signature.contract.free_names for record in self.kernels):
            return (FORMAT_MAJOR, NAMES_MINOR)
        return (FORMAT_MAJOR, SOURCE_MINOR if with_source else PARAMETERS_MINOR if with_parameters else 0)

    def meta(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": "portkern-bundle",
            "version": list(self.written_version()),
            "name": self.name,
            "kernels": [k.to_dict() for k in self.kernels],
        }
        if self.parameters is not None:
            data["parameters"] = self.parameters.to_dict()
        return data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(bundle: Bundle) -> bytes:
    """The bundle's header and payload (with a parameter section, the bytes before it).
    Equal contents give equal bytes."""
    blobs = {sha: bundle.blobs[sha] for sha in sorted(bundle.blobs)}
    return framing.pack(file_format(bundle.written_version()[1]), {"meta": bundle.meta(), "blobs": blobs})


#: `check(header and payload, file size)`, run on what `write_bundle` wrote before it is published.
Check = Callable[[bytes, int], object]


def write_bundle(bundle: Bundle, path: str | Path, check: Check | None = None) -> str:
    """Write atomically (a temp file in the same directory, renamed over `path`: a process that
    loaded the file there keeps reading that one), after `check` (if given) has passed; return
    the bundle digest. Parameters still to be written (`parameter_data`) are streamed
    into the file's parameter section, one piece at a time."""
    if not bundle.parameter_data:
        data = encode(bundle)
        if check is not None:
            check(data, len(data))
        framing.write_atomic(path, data, BundleError)
        return data[HEADER_SIZE - 32 : HEADER_SIZE].hex()
    digest: list[str] = []

    def write(f: BinaryIO) -> None:
        final, end = _write_with_parameters(bundle, f)
        if check is not None:
            check(final, end)
        digest.append(final[HEADER_SIZE - 32 : HEADER_SIZE].hex())

    framing.write_atomic_with(path, write, BundleError)
    return digest[0]


def _write_with_parameters(bundle: Bundle, f: BinaryIO) -> tuple[bytes, int]:
    """Write the bundle and its parameter section into `f`; the header and payload written,
    and the file's size."""
    placed, size = layout(bundle.parameter_data)
    records = tuple(replace(k, parameters=placed.get(k.name, ())) for k in bundle.kernels)
    unknown = sorted(set(placed) - {k.name for k in records})
    if unknown:
        raise BundleError(f"parameters for kernel {unknown[0]!r}, which the bundle does not have")
    chunks = -(-size // CHUNK_BYTES)
    draft = replace(bundle, kernels=records, parameter_data=())
    offset = 0
    for _ in range(4):  # the offset's own encoding can move the section by a boundary, rarely twice
        section = ParameterSection(offset, size, CHUNK_BYTES, ("0" * 64,) * chunks, "0" * 64)
        head = encode(replace(draft, parameters=section))
        if section_offset(len(head)) == offset:
            break
        offset = section_offset(len(head))
    else:
        raise BundleError("cannot place the parameter section")
    section = write_section(f, bundle.parameter_data, placed, offset, size)
    final = encode(replace(draft, parameters=section))
    if len(final) != len(head):
        raise BundleError("the bundle header changed size while its parameters were written")
    f.seek(0)
    f.write(final)
    f.write(bytes(offset - len(final)))
    f.seek(offset + size)
    return final, offset + size


def read_bundle(path: str | Path, validated: Callable[[str], bool] | None = None) -> Bundle:
    """Read and check a bundle file; raise a `BundleError` subclass if it is not sound.

    `validated(digest)` may say that a payload with this digest already passed
    the schema check (the digest itself is always verified), to skip repeating it.
    A parameter section is not read: its layout is checked against the file's size, its
    bytes chunk by chunk when a kernel first uses them (`portkern.jit.parameters`).
    """
    data, size = read_bundle_head(path)
    return decode_file(path, data, validated, size)


def read_bundle_head(path: str | Path) -> tuple[bytes, int]:
    """A bundle file's header and payload (and the gap before a parameter section), read once
    and bounded, not yet checked; and the file's size."""
    return framing.read_head(path, MAGIC, MAX_BUNDLE_BYTES, SECTION_ALIGNMENT, "bundle", BundleError, OversizeFieldError)


def read_bundle_bytes(path: str | Path) -> bytes:
    """`read_bundle_head`'s bytes."""
    return read_bundle_head(path)[0]


def decode_file(path: str | Path, data: bytes, validated: Callable[[str], bool] | None = None, file_size: int | None = None) -> Bundle:
    """`decode`, with errors naming the file the bytes came from (its size: `file_size`,
    default: the file's size now)."""
    try:
        if file_size is None:
            try:
                file_size = Path(path).stat().st_size
            except OSError as exc:
                raise BundleError(f"cannot read bundle: {exc.strerror or exc}") from None
        return decode(data, validated, file_size)
    except BundleError as exc:
        raise type(exc)(f"{path}: {exc}") from None


def file_format(minor: int = FORMAT_MINOR) -> framing.Format:
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


def decode(data: bytes, validated: Callable[[str], bool] | None = None, file_size: int | None = None) -> Bundle:
    """Parse and check bundle bytes: a whole file, or its first bytes (`read_bundle_head`)
    and the file's size (see `read_bundle` for `validated`)."""
    version, digest, document, end = framing.unpack_prefix(file_format(), data)
    file_size = len(data) if file_size is None else file_size
    skip = validated is not None and validated(digest)
    meta, blobs = framing.meta_and_blobs(document, "bundle", MalformedBundleError, validate=not skip)
    _check_names(meta)
    _check_blobs(meta, blobs)
    kernels = tuple(KernelRecord.from_dict(k) for k in meta["kernels"])
    section = _check_parameters(meta, version, kernels, data, end, file_size)
    if version[1] < SOURCE_MINOR and any(stage.is_source for k in kernels for stage in k.stages):
        raise MalformedBundleError(f"source stages need format 1.{SOURCE_MINOR}; the header says {version[0]}.{version[1]}")
    if version[1] < NAMES_MINOR and any("identifiers" in k.get("signature", {}).get("contract", {}) for k in meta["kernels"]):
        raise MalformedBundleError(f"argument identifiers need format 1.{NAMES_MINOR}; the header says {version[0]}.{version[1]}")
    if version[1] < NAMES_MINOR and any(k.signature.contract is not None and k.signature.contract.free_names for k in kernels):
        raise MalformedBundleError(f"free-text argument names need format 1.{NAMES_MINOR}; the header says {version[0]}.{version[1]}")
    if version[1] < EXPRESSIONS_MINOR and any(k.signature.contract is not None and k.signature.contract.has_expressions for k in kernels):
        raise MalformedBundleError(f"contract conditions and result expressions need format 1.{EXPRESSIONS_MINOR}; the header says {version[0]}.{version[1]}")
    return Bundle(meta["name"], kernels, blobs, digest, version, section)


def _check_parameters(
    meta: dict[str, Any], version: tuple[int, int], kernels: tuple[KernelRecord, ...], data: bytes, end: int, file_size: int
) -> ParameterSection | None:
    """The parameter section, its layout checked against the records and the file size;
    None when there is none (then nothing may follow the payload)."""
    if "parameters" not in meta:
        if any(k.parameters for k in kernels):
            raise MalformedBundleError("kernels refer to parameters, but the bundle has no parameter section")
        if file_size > end:
            raise MalformedBundleError(f"{file_size - end} unexpected bytes after the payload")
        return None
    if version[1] < PARAMETERS_MINOR:
        raise MalformedBundleError(f"a parameter section needs format 1.{PARAMETERS_MINOR}; the header says {version[0]}.{version[1]}")
    section = ParameterSection.from_dict(meta["parameters"])
    check_layout(section, end, {k.name: k.parameters for k in kernels})
    gap = data[end : section.offset]
    if len(gap) == section.offset - end and any(gap):
        raise MalformedBundleError("non-zero bytes between the payload and the parameter section")
    check_file_size(section, file_size)
    return section


def _check_names(meta: dict[str, Any]) -> None:
    names = [k["name"] for k in meta["kernels"]]
    if len(names) != len(set(names)):
        raise MalformedBundleError("two kernels share a name")


def _check_blobs(meta: dict[str, Any], blobs: dict[str, bytes]) -> None:
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
