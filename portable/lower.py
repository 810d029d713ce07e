"""MLIR and ONNX kernels: from source to a device-independent IREE stage."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from portkern.base.errors import BuildError, CompileError, brief
from portkern.base.records import frozen_record
from portkern.portable import onnx_semantics
from portkern.portable.bundle import Signature, TensorSpec
from portkern.portable.compiler import Compiler, bytecode, bytecode_version
from portkern.portable.dtypes import BY_ELEMENT
from portkern.portable.manifest import KernelSpec
from portkern.portable.onnx_limits import check_model
from portkern.portable.onnx_model import failing_operator
from portkern.portable.onnx_parameters import has_external_data, importer_flags, is_large, load_kernel_graph, opset_of, parameter_data
from portkern.portable.parameters import ParameterData, referenced
from portkern.portable.producer import Producer, current_producer
from portkern.portable.torch_import import import_torch

#: The phase stored as the device-independent stage.
PORTABLE_PHASE = "flow"

#: Flags of the compiler session that lowers sources: f64 stays f64 (by default IREE demotes it
#: to f32 and changes the entry function's signature under the caller); convolutions become
#: im2col and a matmul (global optimisation, before the flow stage; kernels without a
#: convolution lower to the same stage), which IREE's CPU code runs far faster than its direct
#: convolutions (docs/torch.md, "Convolutions").
IM2COL_FLAGS = ("--iree-global-opt-use-im2col-for-convs",)
BUILD_FLAGS = ("--iree-input-demote-f64-to-f32=false", *IM2COL_FLAGS)

#: Large ONNX files (`onnx_parameters.is_large`; at this opset or newer) are imported without the
#: importer's in-memory checker and shape inference, which copy the whole model two or three times.
ONNX_OPSET = 17
ONNX_IMPORT_TIMEOUT_S = 600

_TORCH_TENSOR = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],(\w+)>$")


@frozen_record
class Lowered:
    """A kernel lowered to its portable stage."""

    entry: str
    signature: Signature
    stage_bytes: bytes
    producer: Producer
    #: The MLIR (text or bytecode) the stage was lowered from: the source, or the ONNX importer's output.
    source: bytes = b""
    #: Named parameters the stage refers to, with readers of their bytes.
    parameters: tuple[ParameterData, ...] = ()


def lower_source(spec: KernelSpec, compiler: Compiler, workdir: Path | None = None) -> Lowered:
    """Lower an `mlir`, `onnx` or `torch` kernel to the portable (flow) stage (`workdir`: where a
    PyTorch program's weights wait, until the bundle is written)."""
    parameters: tuple[ParameterData, ...] = ()
    if spec.kind == "torch":
        if workdir is None:
            raise BuildError(f"{spec.source}: a PyTorch program is built through build_file (it needs a work directory)")
        text, parameters = import_torch(spec.source, spec.name, workdir)
    elif spec.kind == "onnx":
        text, parameters = _import_onnx_kernel(spec)
    else:
        text = spec.source.read_bytes()
    try:
        module = compiler.parse(text, name=spec.name)
        entry, signature = find_entry(module, spec)
        lowered = compiler.lower(module, from_phase="start", to_phase=PORTABLE_PHASE, name=spec.name)
    except BuildError:
        raise
    except CompileError as exc:
        message = str(exc).replace(chr(34) + '-' + chr(34), spec.source.name)
        op = failing_operator(text, message) if spec.kind == "onnx" else None
        raise BuildError(f"{spec.source}: {f'IREE cannot compile ONNX operator {op}: ' if op else ''}{message}") from None
    data = bytecode(lowered)
    return Lowered(entry, signature, data, current_producer(bytecode_version(data)), text, parameters)


def _import_onnx_kernel(spec: KernelSpec) -> tuple[bytes, tuple[ParameterData, ...]]:
    """The importer's MLIR for an ONNX kernel, and its parameters. A large model at opset
    ONNX_OPSET or newer reaches the checks and the importer without its inline weights
    (`load_graph` leaves them in the file, whence the bundle's section is written). The importer
    reads the model as the bundle keeps it: prepared (`onnx_model.prepare`, as every ONNX intake) and
    its MatMul weights transposed (`portable.onnx_layout`)."""
    model, _ = load_kernel_graph(spec.source)
    large = is_large(spec.source) and opset_of(model) >= ONNX_OPSET
    if large:
        check_model(model.SerializeToString(), str(spec.source))
    else:
        # older models are upgraded by the importer first, which needs the whole model
        check_model(spec.source.read_bytes(), str(spec.source))
    onnx_semantics.rewrite(model)  # what IREE leaves to the hardware, as onnx's reference computes it
    with tempfile.TemporaryDirectory(prefix=f"portkern-onnx-{os.getpid()}-") as tmp:
        path = Path(tmp) / spec.source.name
        path.write_bytes(model.SerializeToString())
        text = import_onnx(path, large=large or has_external_data(model, spec.source), shown=spec.source)
    return text, parameter_data(model, spec.source, spec.name, referenced(text))


def import_onnx(path: Path, large: bool = False, shown: Path | None = None) -> bytes:
    """MLIR text for an ONNX model, from IREE's ONNX importer (run as its own process), with
    its large initializers as parameter references (`portable.onnx_parameters`).

    Models older than opset 17 are upgraded first; when the upgrade itself fails
    (it does for some Pad models), the model is imported as it is. A model with
    external data, or a large one (`large`), is imported as it is, without loading its
    external weights and without in-memory copies of the model. `shown`: the path errors name
    (the user's model, where `path` is a copy of it).
    """
    shown = shown or path
    errors = []
    attempts = ([], ) if large else ([f"--opset-version={ONNX_OPSET}"], [])
    for opset in attempts:
        with tempfile.TemporaryDirectory(prefix=f"portkern-onnx-{os.getpid()}-") as tmp:
            out = Path(tmp) / "model.mlir"
            extra = ["--large-model"] if large else []
            cmd = [sys.executable, "-m", "iree.compiler.tools.import_onnx", str(path), *opset, *extra, *importer_flags(), "-o", str(out)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=ONNX_IMPORT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise BuildError(f"{shown}: ONNX import took longer than {ONNX_IMPORT_TIMEOUT_S} s") from None
            if done.returncode == 0:
                return out.read_bytes()
            errors.append(brief(done.stderr, last=True) or "no message")
    if any("No module named 'onnx'" in e for e in errors):
        raise BuildError(f"{shown}: ONNX import needs the 'onnx' package (pip install 'portkern[onnx]')")
    raise BuildError(f"{shown}: ONNX import failed: {errors[0]}")


def find_entry(module: Any, spec: KernelSpec) -> tuple[str, Signature]:
    """The entry function's name and signature in a source module."""
    from iree.compiler import ir

    public = {}
    for op in module.body.operations:
        op = op.operation
        if op.name not in ("func.func", "util.func"):
            continue
        if "sym_visibility" in op.attributes and str(op.attributes["sym_visibility"]).strip('"') != "public":
            continue
        public[ir.StringAttr(op.attributes["sym_name"]).value] = op
    if not public:
        raise BuildError(f"{spec.source}: no public function to use as entry")
    if spec.entry is None:
        if len(public) > 1:
            raise BuildError(
                f"{spec.source}: several public functions ({', '.join(sorted(public))}); "
                f"name one with `entry:` in the manifest"
            )
        name = next(iter(public))
    elif spec.entry in public:
        name = spec.entry
    else:
        raise BuildError(f"{spec.source}: no public function {spec.entry!r} (found: {', '.join(sorted(public))})")
    return name, _signature(public[name], spec)


def _signature(func: Any, spec: KernelSpec) -> Signature:
    from iree.compiler import ir

    ftype = ir.TypeAttr(func.attributes["function_type"]).value
    inputs = tuple(_tensor(t, f"argument {i}", spec) for i, t in enumerate(ftype.inputs))
    results = tuple(_tensor(t, f"result {i}", spec) for i, t in enumerate(ftype.results))
    return Signature(inputs, results)


def _tensor(mlir_type: Any, what: str, spec: KernelSpec) -> TensorSpec:
    from iree.compiler import ir

    if isinstance(mlir_type, ir.RankedTensorType):
        tensor = mlir_type
        shape = tuple(None if tensor.is_dynamic_dim(i) else tensor.get_dim_size(i) for i in range(tensor.rank))
        return TensorSpec(shape, _dtype(str(tensor.element_type), what, spec))
    match = _TORCH_TENSOR.match(str(mlir_type))
    if match:
        dims = [d.strip() for d in match.group(1).split(",") if d.strip()]
        shape = tuple(None if d in ("?", "-1") else int(d) for d in dims)
        return TensorSpec(shape, _dtype(match.group(2), what, spec))
    raise BuildError(f"{spec.source}: {what} of {spec.name!r} has type {mlir_type}; only ranked tensors are supported")


def _dtype(element: str, what: str, spec: KernelSpec) -> str:
    try:
        return BY_ELEMENT[element]
    except KeyError:
        raise BuildError(
            f"{spec.source}: {what} of {spec.name!r} has element type {element}, which has no NumPy dtype"
        ) from None
