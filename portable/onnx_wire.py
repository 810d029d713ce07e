"""ONNX models with large inline weights, read without loading them: the protobuf wire format
scanned over a memory map.

`strip_initializers` finds the initializers of `ModelProto.graph` (field 7 ->
`GraphProto.initializer`, field 5) that hold their bytes inline (`TensorProto.raw_data`,
field 9) and writes a copy of the model in which each of them is external data pointing at
those bytes in the original file (`location`, `offset`, `length`; `data_location` EXTERNAL).
Only the message headers are read; the weights' pages are never touched, so the memory a
build needs does not grow with the model. The parser is bounded: every length is checked
against its enclosing message and the file, varints are at most 10 bytes, and anything it
cannot read is a `BuildError`.
"""

from __future__ import annotations

import math
import mmap
from pathlib import Path
from typing import Iterator

from portkern.base.errors import BuildError
from portkern.base.records import frozen_record

# Field numbers (onnx.proto3).
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_SEGMENT, _TENSOR_NAME = 1, 2, 3, 8
_TENSOR_RAW_DATA, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 9, 13, 14
_TENSOR_TYPED_DATA = frozenset((4, 5, 6, 7, 10, 11))
_EXTERNAL = 1
# Wire types.
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5

#: Bytes per element of the ONNX element types whose raw data can be moved as it is
#: (sub-byte and string types stay inline).
ITEM_SIZE = {
    1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
    17: 1, 18: 1, 19: 1, 20: 1,
}


@frozen_record
class Span:
    """Where an initializer's raw bytes lie in the original model file."""

    offset: int
    size: int


@frozen_record
class Stripped:
    """A model whose large inline initializers refer to their bytes in the original file."""

    #: The serialized model, without those initializers' bytes.
    model: bytes
    #: Per moved initializer (by its ONNX name): where its bytes are in the original file.
    spans: dict[str, Span]


@frozen_record
class _Field:
    number: int
    wire: int
    #: Where the field starts (its tag) and where its value starts and ends.
    start: int
    value_start: int
    end: int
    #: The value of a varint field.
    value: int = 0


class _Reader:
    def __init__(self, data: mmap.mmap, where: str) -> None:
        self.data = data
        self.where = where

    def fail(self, what: str) -> BuildError:
        return BuildError(f"{self.where}: ONNX import failed: not a readable ONNX model ({what})")

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        value = shift = 0
        for i in range(10):
            if pos >= end:
                raise self.fail(f"a varint runs past its message at byte {pos}")
            byte = self.data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if i == 9 and byte > 1:
                    break
                return value, pos
            shift += 7
        raise self.fail(f"a varint longer than 64 bits before byte {pos}")

    def fields(self, start: int, end: int) -> Iterator[_Field]:
        pos = start
        while pos < end:
            tag, value_start = self.varint(pos, end)
            number, wire = tag >> 3, tag & 7
            if number == 0:
                raise self.fail(f"field number 0 at byte {pos}")
            value = 0
            if wire == _VARINT:
                value, value_end = self.varint(value_start, end)
            elif wire == _FIXED64:
                value_end = value_start + 8
            elif wire == _FIXED32:
                value_end = value_start + 4
            elif wire == _LENGTH:
                length, value_start = self.varint(value_start, end)
                value_end = value_start + length
            else:
                raise self.fail(f"wire type {wire} (groups are not used by ONNX) at byte {pos}")
            if value_end > end:
                raise self.fail(f"field {number} at byte {pos} runs past its message")
            yield _Field(number, wire, pos, value_start, value_end, value)
            pos = value_end


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_field(number: int, payload: bytes) -> bytes:
    return _varint_bytes(number << 3 | _LENGTH) + _varint_bytes(len(payload)) + payload


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _external_tensor(reader: _Reader, tensor: _Field, location: str, threshold: int) -> tuple[str | None, tuple[Span, bytes] | None]:
    """The tensor's name, and the tensor as external data in the original file (where its
    bytes are, and the rewritten message) if it is a large inline one."""
    data = reader.data
    dims: list[int] = []
    data_type = location_kind = 0
    name = None
    raw = None
    movable = True
    kept: list[tuple[int, int]] = []
    for f in reader.fields(tensor.value_start, tensor.end):
        if f.number not in (_TENSOR_RAW_DATA, _TENSOR_DATA_LOCATION):
            kept.append((f.start, f.end))
        if f.number == _TENSOR_DIMS and f.wire == _VARINT:
            dims.append(_signed(f.value))
        elif f.number == _TENSOR_DIMS and f.wire == _LENGTH:
            pos = f.value_start
            while pos < f.end:
                value, pos = reader.varint(pos, f.end)
                dims.append(_signed(value))
        elif f.number == _TENSOR_DATA_TYPE and f.wire == _VARINT:
            data_type = f.value
        elif f.number == _TENSOR_NAME and f.wire == _LENGTH:
            try:
                name = bytes(data[f.value_start : f.end]).decode("utf-8")
            except UnicodeDecodeError:
                raise reader.fail(f"an initializer name at byte {f.value_start} is not UTF-8") from None
        elif f.number == _TENSOR_RAW_DATA and f.wire == _LENGTH:
            raw = (f.value_start, f.end)
        elif f.number == _TENSOR_DATA_LOCATION and f.wire == _VARINT:
            location_kind = f.value
        elif f.number in (_TENSOR_SEGMENT, _TENSOR_EXTERNAL_DATA) or f.number in _TENSOR_TYPED_DATA:
            movable = False
        elif f.number in (_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME, _TENSOR_RAW_DATA, _TENSOR_DATA_LOCATION):
            raise reader.fail(f"tensor field {f.number} with wire type {f.wire} at byte {f.start}")
    if not movable or raw is None or location_kind == _EXTERNAL or not name or data_type not in ITEM_SIZE:
        return name, None
    if any(d < 0 for d in dims):
        raise reader.fail(f"initializer {name!r} has a negative dimension")
    count = math.prod(dims)
    size = raw[1] - raw[0]
    if count < threshold:
        return name, None
    if count * ITEM_SIZE[data_type] != size:
        raise reader.fail(f"initializer {name!r} has {size} bytes of raw data, its shape {dims} needs {count * ITEM_SIZE[data_type]}")
    body = b"".join(bytes(data[a:b]) for a, b in kept)
    for key, text in (("location", location), ("offset", str(raw[0])), ("length", str(size))):
        body += _length_field(_TENSOR_EXTERNAL_DATA, _length_field(1, key.encode()) + _length_field(2, text.encode()))
    body += _varint_bytes(_TENSOR_DATA_LOCATION << 3 | _VARINT) + _varint_bytes(_EXTERNAL)
    return name, (Span(raw[0], size), body)


def strip_initializers(path: Path, threshold: int) -> Stripped | None:
    """The model at `path` with every inline initializer of at least `threshold` elements
    moved out (as external data in `path` itself); None when there is none to move, or when
    the model is not one this scan rewrites (several graphs, repeated initializer names)."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise BuildError(f"{path}: cannot read the ONNX model: {exc.strerror or exc}") from None
    with f:
        size = path.stat().st_size
        if size == 0:
            raise BuildError(f"{path}: ONNX import failed: not a readable ONNX model (the file is empty)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _strip(_Reader(data, str(path)), size, path.name, threshold)


def _strip(reader: _Reader, size: int, location: str, threshold: int) -> Stripped | None:
    data = reader.data
    model_fields = list(reader.fields(0, size))
    graphs = [f for f in model_fields if f.number == _MODEL_GRAPH]
    if len(graphs) != 1 or graphs[0].wire != _LENGTH:
        return None
    graph_parts: list[bytes] = []
    spans: dict[str, Span] = {}
    names: set[str | None] = set()
    for f in reader.fields(graphs[0].value_start, graphs[0].end):
        moved = None
        if f.number == _GRAPH_INITIALIZER and f.wire == _LENGTH:
            name, moved = _external_tensor(reader, f, location, threshold)
            if name in names:
                return None
            names.add(name)
        if moved is None:
            graph_parts.append(bytes(data[f.start : f.end]))
            continue
        assert name is not None  # a tensor is moved only when it has a name
        spans[name], body = moved
        graph_parts.append(_length_field(_GRAPH_INITIALIZER, body))
    if not spans:
        return None
    parts = []
    for f in model_fields:
        if f.number == _MODEL_GRAPH:
            parts.append(_length_field(_MODEL_GRAPH, b"".join(graph_parts)))
        else:
            parts.append(bytes(data[f.start : f.end]))
    return Stripped(b"".join(parts), spans)
