"""ONNX initializers as named parameters: which ones, and readers of their bytes.

IREE's ONNX importer, run with `--externalize-params --no-save-params`, replaces every
initializer of at least `ELEMENTS_THRESHOLD` elements by a global that refers to it as
`#stream.parameter.named<"model"::"<name>">`; smaller ones (shape and axis constants,
scalars, short vectors) stay in the code, where the compiler folds them (read into the model
first when an external data file holds them: `inline_small_tensors`). The bytes of each
referenced initializer are then read here, straight from the model file or from its
external data file, piece by piece, so that the builder never holds the whole model.
"""

from __future__ import annotations

import math
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from portkern.base.errors import BuildError
from portkern.portable.onnx_layout import TRANSPOSED_KEY, bool_parameters_as_bytes, transpose_matmul_weights
from portkern.portable.onnx_model import constant_value, prepare
from portkern.portable.onnx_wire import strip_initializers
from portkern.portable.parameters import DEFAULT_SCOPE, ParameterData, Reader, bytes_pieces, file_pieces, transposed_file_pieces

#: Initializers with at least this many elements become parameters (1 KiB of float32).
ELEMENTS_THRESHOLD = 256
#: ONNX files this large are read without loading their inline weights.
LARGE_ONNX_BYTES = 64 << 20



def importer_flags(threshold: int = ELEMENTS_THRESHOLD) -> list[str]:
    """The importer's flags that turn large initializers into parameter references."""
    return ["--externalize-params", "--no-save-params", f"--num-elements-threshold={threshold}", f"--params-scope={DEFAULT_SCOPE}"]


def is_large(path: Path) -> bool:
    """Whether an ONNX model file is read without loading its inline weights."""
    return path.stat().st_size >= LARGE_ONNX_BYTES


def load_graph(path: Path) -> Any:
    """The ONNX model without its external data (BuildError if it cannot be read). A model file
    of LARGE_ONNX_BYTES or more is not loaded whole: each inline initializer of at least
    ELEMENTS_THRESHOLD elements comes as external data in the model file itself
    (`portable.onnx_wire`), so that the weights stay on disk."""
    try:
        import onnx
    except ImportError:
        raise BuildError(f"{path}: ONNX import needs the 'onnx' package (pip install 'portkern[onnx]')") from None
    stripped = strip_initializers(path, ELEMENTS_THRESHOLD) if is_large(path) else None
    try:
        if stripped is not None:
            return onnx.load_model_from_string(stripped.model)
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - an untrusted file: protobuf and onnx raise several unrelated types
        raise BuildError(f"{path}: ONNX import failed: not a readable ONNX model ({type(exc).__name__}: {exc})") from None


def load_kernel_graph(path: Path) -> tuple[Any, list[str]]:
    """`load_graph`'s model prepared as every ONNX intake prepares it (`onnx_model.prepare`), with
    its MatMul and Gemm weights stored transposed and its boolean parameters stored as bytes
    (`portable.onnx_layout`), as the bundle keeps it, and the names of the transposed weights."""
    model = load_graph(path)
    inline_small_tensors(model, path)
    prepare(model)
    transposed = transpose_matmul_weights(model, ELEMENTS_THRESHOLD)
    bool_parameters_as_bytes(model, ELEMENTS_THRESHOLD)
    return model, transposed


def inline_small_tensors(model: Any, path: Path, threshold: int = ELEMENTS_THRESHOLD) -> int:
    """Bring the bytes of every initializer (and constant attribute) of fewer than `threshold`
    elements that an external data file holds into the model, as the importer keeps such tensors
    in the code and reads them from the model alone (`--large-model` leaves them empty). What
    stays external is only what becomes a parameter. The number of tensors brought in."""
    from onnx import TensorProto
    from onnx.external_data_helper import uses_external_data

    count = 0
    for tensor in _tensors(model.graph):
        if uses_external_data(tensor) and math.prod(tensor.dims) < threshold:
            size = math.prod(tensor.dims) * _itemsize(tensor, path)
            location, offset = _external(tensor, path, size)
            with open(location, "rb") as file:
                file.seek(offset)
                tensor.raw_data = file.read(size)
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT
            count += 1
    return count


def _tensors(graph: Any) -> Iterator[Any]:
    """The graph's initializers and tensor attributes, subgraphs' included."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for sub in attribute.graphs:
                yield from _tensors(sub)


def opset_of(model: Any) -> int:
    """The model's default-domain opset version (0 when it states none)."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def has_external_data(model: Any, path: Path | None = None) -> bool:
    """Whether any initializer keeps its bytes in an external data file (with the model's `path`:
    other than the model file itself, where `load_graph` leaves a large model's inline weights)."""
    from onnx.external_data_helper import uses_external_data

    def elsewhere(tensor: Any) -> bool:
        return path is None or any(e.key == "location" and e.value != path.name for e in tensor.external_data)

    return any(uses_external_data(t) and elsewhere(t) for t in model.graph.initializer)


def sanitized(name: str) -> str:
    """An initializer's name as the importer writes it in a parameter reference."""
    return name.replace(":", "_")


def parameter_data(model: Any, path: Path, kernel: str, references: list[tuple[str, str]]) -> tuple[ParameterData, ...]:
    """Readers of the referenced initializers' bytes, in reference order."""
    by_name = {sanitized(t.name): t for t in model.graph.initializer if t.name}
    # the importer makes a large Constant node's value a parameter too (as the rewrites of
    # `onnx_semantics` may add)
    for node in model.graph.node:
        if node.output and node.output[0]:
            value = constant_value(node)
            if value is not None:
                by_name.setdefault(sanitized(node.output[0]), value)
    data = []
    for scope, name in references:
        tensor = by_name.get(name)
        if tensor is None:
            raise BuildError(f"{path}: the imported model refers to parameter {name!r}, which is not an initializer")
        itemsize = _itemsize(tensor, path)
        size = math.prod(tensor.dims) * itemsize
        data.append(ParameterData(kernel, scope, name, size, _reader(tensor, path, size, itemsize)))
    return tuple(data)


def _itemsize(tensor: Any, path: Path) -> int:
    """Bytes per element of a tensor (BuildError for a type without a fixed size)."""
    from onnx import helper

    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except KeyError:  # a type onnx does not know
        itemsize = 0
    if not itemsize or tensor.data_type == tensor.STRING:
        raise BuildError(f"{path}: initializer {tensor.name!r} has ONNX type {tensor.data_type}, which cannot be a parameter")
    return itemsize


def _external(tensor: Any, path: Path, size: int) -> tuple[Path, int]:
    """Where a tensor's `size` bytes of external data lie: the file (in the model's folder) and offset."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    base = path.parent.resolve()
    location = (base / info.get("location", "")).resolve()
    if base not in location.parents and location != path.resolve():  # the model file itself: weights left inline
        raise BuildError(f"{path}: initializer {tensor.name!r} has external data outside the model's folder ({info.get('location')!r})")
    try:
        offset = int(info.get("offset", 0))
        found = location.stat()
        if not stat.S_ISREG(found.st_mode):  # (a named pipe would be waited on, a device read without end)
            raise BuildError(f"{path}: external data of {tensor.name!r} is not in a regular file ({info.get('location')!r})")
        available = found.st_size - offset
        length = int(info.get("length", available))
    except OSError as exc:
        raise BuildError(f"{path}: external data of {tensor.name!r}: {exc.strerror or exc}") from None
    except ValueError:
        raise BuildError(f"{path}: external data of {tensor.name!r} has an offset or length that is not a number") from None
    if length != size or available < size:
        raise BuildError(f"{path}: external data of {tensor.name!r} has {min(length, available)} bytes, its shape needs {size}")
    return location, offset


def _reader(tensor: Any, path: Path, size: int, itemsize: int) -> Reader:
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    if uses_external_data(tensor):
        info = {entry.key: entry.value for entry in tensor.external_data}
        location, offset = _external(tensor, path, size)
        if TRANSPOSED_KEY in info:  # stored as dims[1] x dims[0], kept as dims
            return transposed_file_pieces(location, offset, tensor.dims[1], tensor.dims[0], itemsize)
        return file_pieces(location, offset, size)
    # The bytes are taken from the model only when written: a copy of one tensor at a time.
    if tensor.HasField("raw_data"):
        return lambda: bytes_pieces(tensor.raw_data)()

    def typed() -> Iterator[bytes | memoryview]:
        array = numpy_helper.to_array(tensor)
        return bytes_pieces(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())()

    return typed
