"""A structure-aware bundle fuzzer, shared by tests/test_fuzz.py and bench/fuzz.py.

From a valid seed bundle it makes re-sealed mutations of four kinds:

- "raw": bytes of the file flipped, overwritten, inserted, deleted or cut off (nothing re-sealed);
- "payload": bytes of the msgpack payload mutated, the header's length and digest recomputed;
- "metadata": one value of the metadata replaced by a hostile one (huge and negative integers,
  long strings, path-like names, deep nesting, wrong types), or a key added, then re-sealed;
- "blob": an MLIR bytecode, SPIR-V or SPIR blob, or a source stage (zlib MLIR text, as
  compressed bytes or as text; ONNX protobuf), mutated, its name (sha256), size and every reference to it recomputed, then re-sealed.

Re-sealing keeps the seed's format version and its parameter section (placed after the new payload). A seed of another IREE release (`build_seed(...,
foreign=...)`, the producer records re-sealed) has its kernels compiled from their source stages,
so mutated source stages reach the device's importer and compiler (in workers).

`slow_module` is MLIR that makes the compiler run long (for the compile-time bound).

Each case is loaded, every kernel finalised and called. The allowed outcomes are a
`PortkernError` subclass ("refused") or a run whose results have the signature's shapes and
dtypes ("ran"), equal to the seed's results when the kernel's stage is unchanged. Anything
else is a finding: "untyped" (another exception) or "wrong".
"""

from __future__ import annotations

import hashlib
import random
import traceback
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import msgpack
import numpy as np
from helpers import dense_onnx, reseal

import portkern
from portkern.base import framing
from portkern.base.errors import PortkernError
from portkern.cache.store import Store
from portkern.portable.bundle import MAGIC
from portkern.portable.parameters import section_offset
from portkern.portable.source import FORMATS as SOURCE_FORMATS
from portkern.portable.source import MLIR_TEXT

KINDS = ("raw", "payload", "metadata", "blob")
#: Blob formats the "blob" kind mutates (never prebuilt native code: that is trusted by signature, not parsed).
MUTABLE_FORMATS = ("mlir-bytecode", "spirv", "spir-bitcode", *SOURCE_FORMATS)

SEED_MLIR = """func.func @"fuzz-seed.main"(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>, %c: tensor<4xf32>) -> tensor<4x4xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x4xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<4x4xf32>) -> tensor<4x4xf32>
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>) outs(%f : tensor<4x4xf32>) -> tensor<4x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
       ins(%m, %c : tensor<4x4xf32>, tensor<4xf32>) outs(%e : tensor<4x4xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    %t = math.tanh %s : f32
    linalg.yield %t : f32
  } -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}
"""

SEED_OPENCL = """__kernel void scale_add(__global const float* a, __global const float* b, __global float* c) {
  size_t i = get_global_id(0);
  c[i] = 2.0f * a[i] + b[i];
}
"""

SEED_MANIFEST = """bundle: fuzz-seed
kernels:
  - name: tiny
    source: tiny.mlir
{opencl}"""

OPENCL_ENTRY = """  - name: scale_add
    source: scale_add.cl
    args:
      - {name: a, dtype: float32, role: in, shape: [N]}
      - {name: b, dtype: float32, role: in, shape: [N]}
      - {name: c, dtype: float32, role: out, shape: [N]}
    global: [N]
"""

ONNX_ENTRY = """  - name: dense
    source: dense.onnx
"""

HOSTILE: tuple[Any, ...] = (
    2**63 - 1, -(2**63), 2**64 - 1, -1, 0, 10**12, 1.5, float("nan"), None, True, b"\x00bytes", "", [], {},
    "A" * 70_000, "B" * 5_000, "../../etc/passwd", "/etc/passwd", "a/b", "..", "C:\\evil", "name\x00nul", "\u202eltr",
)


def build_seed(where: Path, opencl: bool, onnx: bool = False, foreign: str = "") -> Path:
    """The seed bundle: a tiny MLIR kernel with its source stage, a tiny OpenCL kernel when
    `opencl`, a tiny ONNX model when `onnx`; re-sealed as built by IREE `foreign` when given."""
    from portkern.portable.builder import build_file

    where.mkdir(parents=True, exist_ok=True)
    (where / "tiny.mlir").write_text(SEED_MLIR)
    (where / "scale_add.cl").write_text(SEED_OPENCL)
    if onnx:
        (where / "dense.onnx").write_bytes(dense_onnx())
    entries = (OPENCL_ENTRY if opencl else "") + (ONNX_ENTRY if onnx else "")
    (where / "manifest.yaml").write_text(SEED_MANIFEST.format(opencl=entries))
    build_file(where / "manifest.yaml", where / "seed.pkb")
    if foreign:
        return reseal(where / "seed.pkb", where / "foreign-seed.pkb", foreign)
    return where / "seed.pkb"


@dataclass(frozen=True)
class Case:
    index: int
    kind: str
    what: str
    data: bytes


@dataclass(frozen=True)
class Outcome:
    case: Case
    #: "refused", "ran", "untyped" or "wrong".
    result: str
    detail: str = ""


def slow_module(ops: int = 1500) -> str:
    """One elementwise dispatch whose body chains `ops` transcendental functions: cheap to
    lower to flow, tens of seconds of LLVM code generation."""
    body = []
    for i in range(1, ops + 1):
        body.append(f"    %t{i} = {('math.sin', 'math.exp', 'math.tanh', 'math.cos')[i % 4]} %x{i - 1} : f32")
        body.append(f"    %x{i} = arith.addf %t{i}, %x{i - 1} : f32")
    lines = [
        "func.func @slow(%a: tensor<64xf32>) -> tensor<64xf32> {",
        "  %e = tensor.empty() : tensor<64xf32>",
        "  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],"
        ' iterator_types = ["parallel"]} ins(%a : tensor<64xf32>) outs(%e : tensor<64xf32>) {',
        "  ^bb0(%x0: f32, %o: f32):",
        *body,
        f"    linalg.yield %x{ops} : f32",
        "  } -> tensor<64xf32>",
        "  return %r : tensor<64xf32>",
        "}",
    ]
    return "\n".join(lines) + "\n"


# --- making cases -------------------------------------------------------------------


def _seal(payload: bytes, version: tuple[int, int], section: bytes = b"") -> bytes:
    """Header and payload, and after them (from the next page boundary) a parameter section's bytes."""
    header = framing.HEADER.pack(MAGIC, *version, len(payload), hashlib.sha256(payload).digest())
    end = framing.HEADER_SIZE + len(payload)
    return header + payload + (bytes(section_offset(end) - end) + section if section else b"")


def _seal_document(document: dict, version: tuple[int, int], section: bytes) -> bytes:
    """`_seal` of a document whose parameter section (if it has one) is placed where the payload
    now ends: its offset rewritten until the payload's length settles."""
    parameters = document["meta"].get("parameters")
    payload = _pack(document)
    if isinstance(parameters, dict) and section:
        for _ in range(4):
            offset = section_offset(framing.HEADER_SIZE + len(payload))
            if parameters.get("offset") == offset:
                break
            parameters["offset"] = offset
            payload = _pack(document)
    return _seal(payload, version, section)


def _mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    data = bytearray(data)
    how = rng.choice(("flip", "overwrite", "insert", "delete", "truncate", "duplicate"))
    at = rng.randrange(max(1, len(data)))
    if how == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "overwrite":
        span = rng.randint(1, 16)
        data[at : at + span] = bytes(rng.randrange(256) for _ in range(min(span, len(data) - at)))
    elif how == "insert":
        data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif how == "delete":
        del data[at : at + rng.randint(1, 16)]
    elif how == "truncate":
        del data[at:]
    else:
        span = rng.randint(1, 64)
        data[at:at] = data[at : at + span]
    return bytes(data), f"{how}@{at}"


def _paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


def _hostile(rng: random.Random) -> Any:
    choice = rng.randrange(len(HOSTILE) + 2)
    if choice < len(HOSTILE):
        return HOSTILE[choice]
    depth = rng.choice((50, 400))
    nested: Any = "leaf"
    for _ in range(depth):
        nested = [nested] if choice == len(HOSTILE) else {"k": nested}
    return nested


def _set(document: Any, path: tuple, value: Any) -> None:
    *parents, last = path
    for key in parents:
        document = document[key]
    document[last] = value


def cases(
    seed: bytes, count: int, rng_seed: int = 0, kinds: tuple[str, ...] = KINDS, formats: tuple[str, ...] = MUTABLE_FORMATS
) -> Iterator[Case]:
    """`count` mutations of the seed bundle's bytes, the `kinds` in turn ("blob": of stages of `formats`)."""
    rng = random.Random(rng_seed)
    _, *version, length, _ = framing.HEADER.unpack(seed[: framing.HEADER_SIZE])
    version = tuple(version)
    payload = seed[framing.HEADER_SIZE : framing.HEADER_SIZE + length]
    section = seed[section_offset(framing.HEADER_SIZE + length) :]  # a parameter section's bytes, if any
    document = msgpack.unpackb(payload, raw=False)
    meta_paths = list(_paths(document["meta"]))[1:]
    stages = [
        (k, s)
        for k, kernel in enumerate(document["meta"]["kernels"])
        for s, stage in enumerate(kernel["stages"])
        if stage["format"] in formats
    ]
    for index in range(count):
        kind = kinds[index % len(kinds)]
        if kind == "raw":
            data, what = _mutate_bytes(rng, seed)
        elif kind == "payload":
            mutated, what = _mutate_bytes(rng, payload)
            data = _seal(mutated, version, section)
        elif kind == "metadata":
            doc = msgpack.unpackb(payload, raw=False)
            path = rng.choice(meta_paths)
            if rng.random() < 0.15 and isinstance(_get(doc["meta"], path[:-1]), dict):
                path = (*path[:-1], rng.choice(("extra", "../x", "a" * 300)))
            value = _hostile(rng)
            _set(doc["meta"], path, value)
            data = _seal_document(doc, version, section)
            what = f"{'/'.join(map(str, path))}={_short(value)}"
        else:
            doc = msgpack.unpackb(payload, raw=False)
            k, s = rng.choice(stages)
            stage = doc["meta"]["kernels"][k]["stages"][s]
            blob, what = _mutate_blob(rng, doc["blobs"][stage["blob"]], stage["format"])
            _replace_blob(doc, stage["blob"], blob)
            data = _seal_document(doc, version, section)
            what = f"{stage['format']} of kernel {k}: {what}"
        yield Case(index, kind, what, data)


def _mutate_blob(rng: random.Random, data: bytes, fmt: str) -> tuple[bytes, str]:
    """A mutated blob; a zlib MLIR text stage half the time mutated as text and compressed again
    (so that the mutation reaches the MLIR parser rather than zlib)."""
    if fmt == MLIR_TEXT and rng.random() < 0.5:
        text, what = _mutate_bytes(rng, zlib.decompress(data))
        return zlib.compress(text), f"text {what}"
    return _mutate_bytes(rng, data)


def _get(document: Any, path: tuple) -> Any:
    for key in path:
        document = document[key]
    return document


def _pack(document: Any) -> bytes:
    try:
        return msgpack.packb(document, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        return msgpack.packb(document, use_bin_type=True, strict_types=False, default=str)


def _replace_blob(document: dict, old: str, data: bytes) -> None:
    new = hashlib.sha256(data).hexdigest()
    blobs = document["blobs"]
    if new in blobs:
        return
    blobs[new] = data
    del blobs[old]
    for kernel in document["meta"]["kernels"]:
        for item in list(kernel["stages"]) + list(kernel.get("native", ())):
            if item["blob"] == old:
                item["blob"], item["size"] = new, len(data)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} chars)"


# --- running cases ----------------------------------------------------------------------


def inputs_for(record, rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs of the signature's shapes (dynamic dimensions: 16)."""
    arrays = []
    for spec in record.signature.inputs:
        shape = tuple(16 if d is None else d for d in spec.shape)
        arrays.append(rng.standard_normal(shape).astype(spec.dtype))
    return arrays


@dataclass(frozen=True)
class Reference:
    """What the seed's kernel computes on fixed inputs."""

    stage: tuple[str, ...]
    signature: Any
    inputs: list
    outputs: tuple


def references(seed_path: Path, store: Store, device_for) -> dict[str, Reference]:
    bundle = portkern.load(seed_path, store=store)
    found = {}
    for name in bundle.names():
        record = bundle.record(name)
        inputs = inputs_for(record, np.random.default_rng(0))
        outputs = bundle.kernel(name, device=device_for(record))(*inputs)
        found[name] = Reference(_stage_key(record), record.signature, inputs, outputs if isinstance(outputs, tuple) else (outputs,))
    return found


def _stage_key(record) -> tuple[str, ...]:
    return (record.kind, record.entry, *(s.blob for s in record.stages))


def run_case(case: Case, path: Path, store: Store, refs: dict[str, Reference], device_for) -> Outcome:
    """Load the case, finalise and call every kernel; the outcome of the first that does not run."""
    path.write_bytes(case.data)
    try:
        bundle = portkern.load(path, store=store)
        for name in bundle.names():
            record = bundle.record(name)
            ref = refs.get(name)
            same = ref is not None and _stage_key(record) == ref.stage and record.signature == ref.signature
            inputs = ref.inputs if same else inputs_for(record, np.random.default_rng(1))
            outputs = bundle.kernel(name, device=device_for(record))(*inputs)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            problem = _check(record, outputs, ref if same else None)
            if problem:
                return Outcome(case, "wrong", f"{name}: {problem}")
    except PortkernError as exc:
        return Outcome(case, "refused", f"{type(exc).__name__}: {str(exc)[:200]}")
    except Exception as exc:  # noqa: BLE001 - the finding this fuzzer looks for
        return Outcome(case, "untyped", "".join(traceback.format_exception_only(type(exc), exc)).strip()[:500])
    return Outcome(case, "ran")


def _check(record, outputs: tuple, ref: Reference | None) -> str:
    if len(outputs) != len(record.signature.results):
        return f"{len(outputs)} results, the signature has {len(record.signature.results)}"
    for got, spec in zip(outputs, record.signature.results):
        if got.dtype != np.dtype(spec.dtype) or len(got.shape) != len(spec.shape):
            return f"result {got.dtype}{got.shape} does not match {spec}"
        if any(d is not None and d != g for d, g in zip(spec.shape, got.shape)):
            return f"result shape {got.shape} does not match {spec}"
    if ref is not None:
        for got, want in zip(outputs, ref.outputs):
            if not np.array_equal(got, want, equal_nan=True):
                return "an unchanged kernel computed something else"
    return ""


def tally(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    """Counts by kind and result."""
    counts: dict[str, Counter] = {kind: Counter() for kind in KINDS}
    for outcome in outcomes:
        counts[outcome.case.kind][outcome.result] += 1
    return {kind: dict(counter) for kind, counter in counts.items()}
