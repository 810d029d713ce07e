"""The source stage: a kernel as written, which IREE releases other than the one that built the bundle read.

IREE's dialects are not versioned, so a bundle's bytecode stages are read only
by the IREE release that wrote them. Beside them, each MLIR and ONNX kernel
keeps (unless built with `--no-source`) a source stage of phase `start`:

- MLIR kernels: the input-dialect text as written, zlib-compressed
  (`mlir-text-zlib`; chosen over IREE's generic printer form, see
  docs/bundle-format.md);
- ONNX models: the ONNX protobuf (`onnx-protobuf`), with its opset and IR
  version recorded; the device imports it with its own IREE's importer.

A device whose IREE release differs from the bundle's compiles the source
stage with its own compiler (in a worker; nothing of it is parsed in the
process that loads the bundle).
"""

from __future__ import annotations

import tempfile
import zlib
from dataclasses import replace
from pathlib import Path

from portkern.errors import BuildError, IncompatibleProducerError
from portkern.portable.bundle import SOURCE_PHASE, Bundle, KernelRecord, Stage, sha256
from portkern.portable.lower import Lowered, import_onnx
from portkern.portable.manifest import KernelSpec
from portkern.portable.producer import installed_compiler, same_release

class CompatibilityWarning(UserWarning):
    """A bundle built with another IREE release: its kernels are compiled from their source stage."""


MLIR_TEXT = "mlir-text-zlib"
ONNX_PROTOBUF = "onnx-protobuf"
FORMATS = (MLIR_TEXT, ONNX_PROTOBUF)
#: Largest MLIR text a compressed source stage may inflate to.
MAX_SOURCE_TEXT_BYTES = 256 << 20


def source_stage(spec: KernelSpec, lowered: Lowered) -> tuple[Stage, bytes]:
    """A kernel's source stage (recorded as written by the release that built the bundle) and its bytes."""
    data = spec.source.read_bytes()
    producer = replace(lowered.producer, bytecode_version=None)
    if spec.kind == "onnx":
        return Stage(SOURCE_PHASE, "any", ONNX_PROTOBUF, sha256(data), len(data), producer, model=model_info(data, spec)), data
    packed = zlib.compress(data, 9)
    return Stage(SOURCE_PHASE, "any", MLIR_TEXT, sha256(packed), len(packed), producer), packed


def model_info(data: bytes, spec: KernelSpec) -> dict[str, int]:
    """An ONNX model's default-domain opset and IR version (read with the `onnx` package, weights not loaded)."""
    try:
        import onnx

        model = onnx.load_model_from_string(data)
    except ImportError:
        raise BuildError(f"{spec.source}: reading an ONNX model needs the 'onnx' package (pip install 'portkern[onnx]')") from None
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and others for a damaged model
        raise BuildError(f"{spec.source}: not an ONNX model: {exc}") from None
    opsets = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not opsets:
        raise BuildError(f"{spec.source}: the ONNX model imports no default-domain opset")
    return {"opset": int(opsets[0]), "ir_version": int(model.ir_version)}


def readable_stage(record: KernelRecord, family: str) -> Stage:
    """The stage this IREE release finalises for a device family: the built stage when this release
    built it, else the source stage when there is one (else the built stage, which is refused
    naming both releases)."""
    stage = record.stage(family)
    source = record.source_stage()
    if stage.format == "mlir-bytecode" and source is not None and not same_release(stage.producer):
        return source
    return stage


def foreign_release(bundle: Bundle) -> str:
    """What built a bundle (`IREE 3.12.0`) when it is another release than the installed IREE and
    its kernels use their source stage ("" otherwise)."""
    for record in bundle.kernels:
        if record.source_stage() is None:
            continue
        for stage in record.stages:
            if stage.format == "mlir-bytecode" and not same_release(stage.producer):
                compiler = "IREE" if stage.producer.compiler == "iree" else repr(stage.producer.compiler)
                return f"{compiler} {stage.producer.version}"
    return ""


def describe(stage: Stage) -> str:
    """What a stage is, for people: `any/flow`, `amdgpu/executable-sources`, `source (built with IREE 3.12.0)`."""
    if stage.is_source:
        return f"source (built with IREE {stage.producer.version})"
    return f"{stage.family}/{stage.phase}"


def source_text(stage: Stage, data: bytes, name: str) -> bytes:
    """MLIR text of a source stage for this IREE release (an ONNX model imported by its importer);
    IncompatibleProducerError, naming both releases, when this release cannot import it."""
    if stage.format == MLIR_TEXT:
        return inflate(stage, data, name)
    with tempfile.TemporaryDirectory(prefix="portkern-source-") as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(data)
        try:
            return import_onnx(path)
        except BuildError as exc:
            raise unreadable(stage, name, str(exc).replace(str(path), "the model")) from None


def inflate(stage: Stage, data: bytes, name: str) -> bytes:
    """A compressed source stage's text, bounded (`MAX_SOURCE_TEXT_BYTES`)."""
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(data, MAX_SOURCE_TEXT_BYTES)
    except zlib.error as exc:
        raise unreadable(stage, name, f"the compressed text is damaged ({exc})") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise unreadable(stage, name, f"the text is truncated or inflates beyond {MAX_SOURCE_TEXT_BYTES} bytes")
    return text


def unreadable(stage: Stage, name: str, why: str) -> IncompatibleProducerError:
    """The error for a source stage this IREE release cannot read: both releases named."""
    return IncompatibleProducerError(
        f"kernel {name!r}: its source stage ({stage.format}, from a bundle built with IREE {stage.producer.version}) "
        f"cannot be read by the installed IREE {installed_compiler().version}: {why}"
    )
