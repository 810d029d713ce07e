"""The source stage: a kernel as written, which IREE releases other than the one that built the bundle read.

IREE's dialects are not versioned, so a bundle's bytecode stages are read only
by the IREE release that wrote them. Beside them, each kernel compiled by IREE
keeps (unless built with `--no-source`) a source stage of phase `start`:

- MLIR kernels: the input-dialect text as written (a bytecode source printed
  as text), zlib-compressed (`mlir-text-zlib`; chosen over IREE's generic
  printer form, see docs/bundle-format.md);
- ONNX models: the ONNX protobuf (`onnx-protobuf`), with its opset and IR
  version recorded; the device imports it with its own IREE's importer. The
  initializers that the build made parameters keep no bytes here: each is
  marked as external data at `PARAMETER_LOCATION`, and the device's importer
  turns it into a reference to the same parameter in the bundle's section;
- PyTorch programs: the MLIR text iree-turbine exported (torch dialect, every
  weight a parameter reference), zlib-compressed: a `.pt2` file would need
  torch on the device.

A device whose IREE release differs from the bundle's compiles the source
stage with its own compiler (in a worker; nothing of it is parsed in the
process that loads the bundle).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from portkern.base.errors import BuildError, IncompatibleProducerError, printable
from portkern.portable.bundle import SOURCE_PHASE, Bundle, KernelRecord, Stage, sha256
from portkern.portable.parameters import referenced
from portkern.portable.producer import installed_compiler, same_release

if TYPE_CHECKING:
    from portkern.portable.lower import Lowered
    from portkern.portable.manifest import KernelSpec

# The compiler, the ONNX tools and the lowering are imported where they are used: reading which
# stage a device finalises (`readable_stage`, `fitted_phase`, `describe`) must not load them.


class CompatibilityWarning(UserWarning):
    """A bundle built with another IREE release: its kernels are compiled from their source stage."""


MLIR_TEXT = "mlir-text-zlib"
ONNX_PROTOBUF = "onnx-protobuf"
FORMATS = (MLIR_TEXT, ONNX_PROTOBUF)
#: Largest MLIR text a compressed source stage may inflate to.
MAX_SOURCE_TEXT_BYTES = 256 << 20
#: The external-data location of an ONNX source model's initializers whose bytes are the bundle's
#: parameters (named as the importer names them). Not a file: nothing reads it.
PARAMETER_LOCATION = "portkern:parameter-section"
MLIR_BYTECODE_MAGIC = b"ML\xefR"
#: The fields of an ONNX TensorProto that hold its values.
TENSOR_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def source_stage(spec: KernelSpec, lowered: Lowered) -> tuple[Stage, bytes]:
    """A kernel's source stage (recorded as written by the release that built the bundle) and its bytes."""
    from portkern.portable.onnx_parameters import load_kernel_graph, opset_of
    producer = replace(lowered.producer, bytecode_version=None)
    if spec.kind == "onnx":
        model = upgraded(load_kernel_graph(spec.source)[0])
        info = {"opset": opset_of(model), "ir_version": int(model.ir_version)}
        if not info["opset"]:
            raise BuildError(f"{spec.source}: the ONNX model imports no default-domain opset")
        data = onnx_source(model, spec.source, {name for _, name in referenced(lowered.source)})
        return Stage(SOURCE_PHASE, "any", ONNX_PROTOBUF, sha256(data), len(data), producer, model=info), data
    # a PyTorch program's source is what iree-turbine exported from it, its weights parameters
    import zlib

    packed = zlib.compress(lowered.source if spec.kind == "torch" else mlir_text(spec.source.read_bytes(), spec.name), 9)
    return Stage(SOURCE_PHASE, "any", MLIR_TEXT, sha256(packed), len(packed), producer), packed


def mlir_text(data: bytes, name: str) -> bytes:
    """MLIR source as text: text as written, bytecode (`.mlirbc`, which only its own release
    reads) printed by this release's compiler."""
    from portkern.portable.compiler import Compiler
    if not data.startswith(MLIR_BYTECODE_MAGIC):
        return data
    module = Compiler().parse(data, name=name)
    text: str = module.operation.get_asm(enable_debug_info=False)
    return text.encode()


def upgraded(model: Any) -> Any:
    """A model of an opset older than `ONNX_OPSET`, its weights in it, converted to that opset as the
    build's import did (so that the device, which imports a source model as it is, sees the same
    operators); the model as it is when it has external data or the conversion fails."""
    from portkern.portable.lower import ONNX_OPSET
    from portkern.portable.onnx_parameters import has_external_data, opset_of
    if opset_of(model) >= ONNX_OPSET or has_external_data(model):
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, ONNX_OPSET)
    except Exception:  # noqa: BLE001 - the converter raises several types; the importer falls back the same way
        return model


def onnx_source(model: Any, path: Path, parameters: set[str]) -> bytes:
    """An ONNX model (loaded without its external data) as its source stage keeps it: the
    initializers named in `parameters` without their bytes, marked as external data at
    `PARAMETER_LOCATION`; any other initializer's external data read into the model."""
    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    from portkern.portable.onnx_parameters import sanitized

    for tensor in model.graph.initializer:
        if sanitized(tensor.name) in parameters:
            for field in TENSOR_DATA_FIELDS:
                tensor.ClearField(field)
            del tensor.external_data[:]
            tensor.data_location = TensorProto.EXTERNAL
            entry = tensor.external_data.add()
            entry.key, entry.value = "location", PARAMETER_LOCATION
        elif uses_external_data(tensor):
            try:
                load_external_data_for_tensor(tensor, str(path.parent))
            except Exception as exc:  # noqa: BLE001 - onnx raises several types for a missing or escaping file
                raise BuildError(f"{path}: external data of initializer {tensor.name!r}: {exc}") from None
    data: bytes = model.SerializeToString()
    return data


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
                return f"{compiler} {printable(stage.producer.version)}"
    return ""


def fitted_phase(stage: Stage) -> str:
    """The phase a stage's module is at once a worker has parsed and fitted it: a source stage
    is lowered to the flow phase on the way (`portkern.jit.finalize.imported`)."""
    from portkern.portable.lower import PORTABLE_PHASE
    return PORTABLE_PHASE if stage.is_source else stage.phase


def describe(stage: Stage) -> str:
    """What a stage is, for people: `any/flow`, `amdgpu/executable-sources`, `source (built with IREE 3.12.0)`."""
    if stage.is_source:
        return f"source (built with IREE {printable(stage.producer.version)})"
    return f"{stage.family}/{stage.phase}"


def source_text(stage: Stage, data: bytes, name: str) -> bytes:
    """MLIR text of a source stage for this IREE release (an ONNX model imported by its importer);
    IncompatibleProducerError, naming both releases, when this release cannot import it."""
    from portkern.portable.lower import import_onnx
    if stage.format == MLIR_TEXT:
        return inflate(stage, data, name)
    parameters = parameter_initializers(stage, data, name)
    import tempfile  # (in the worker that imports the source stage)

    with tempfile.TemporaryDirectory(prefix="portkern-source-") as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(data)
        try:
            text = import_onnx(path, large=bool(parameters))
        except BuildError as exc:
            raise unreadable(stage, name, str(exc).replace(str(path), "the model")) from None
    inline = sorted(parameters - {reference for _, reference in referenced(text)})
    if inline:
        raise unreadable(stage, name, f"its importer keeps initializer {inline[0]!r} in the code, not as the bundle's parameter")
    return text


def parameter_initializers(stage: Stage, data: bytes, name: str) -> set[str]:
    """The (sanitized) names of a source model's initializers whose bytes are the bundle's parameters;
    a model that refers to any other external data is refused."""
    from portkern.portable.onnx_parameters import sanitized
    try:
        import onnx
        from onnx.external_data_helper import _get_all_tensors, uses_external_data
    except ImportError:
        raise unreadable(stage, name, "reading an ONNX model needs the 'onnx' package (pip install 'portkern[onnx]')") from None
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and others for a damaged model
        raise unreadable(stage, name, f"not an ONNX model ({type(exc).__name__}: {exc})") from None
    found = set()
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
        if location != PARAMETER_LOCATION:
            raise unreadable(stage, name, f"tensor {tensor.name!r} refers to external data {location!r}, not to the bundle's parameters")
        found.add(sanitized(tensor.name))
    return found


def inflate(stage: Stage, data: bytes, name: str) -> bytes:
    """A compressed source stage's text, bounded (`MAX_SOURCE_TEXT_BYTES`)."""
    import zlib

    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(data, MAX_SOURCE_TEXT_BYTES)
    except zlib.error as exc:
        raise unreadable(stage, name, f"the compressed text is damaged ({exc})") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise unreadable(stage, name, f"the text is truncated or inflates beyond {MAX_SOURCE_TEXT_BYTES} bytes")
    return text


def uncompilable(stage: Stage, name: str, text: bytes, message: str) -> IncompatibleProducerError:
    """`unreadable` for a compiler diagnostic on a source stage's text (naming the ONNX operator
    it points at, for a model)."""
    from portkern.portable.onnx_model import failing_operator
    operator = failing_operator(text, message) if stage.format == ONNX_PROTOBUF else None
    return unreadable(stage, name, f"IREE cannot compile ONNX operator {operator}: {message}" if operator else message)


def unreadable(stage: Stage, name: str, why: str) -> IncompatibleProducerError:
    """The error for a source stage this IREE release cannot read: both releases named."""
    return IncompatibleProducerError(
        f"kernel {name!r}: its source stage ({stage.format}, from a bundle built with IREE {printable(stage.producer.version)}) "
        f"cannot be read by the installed IREE {installed_compiler().version}: {why}"
    )
