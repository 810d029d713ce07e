"""Element types: MLIR/torch element type names -> the NumPy dtype names signatures record, and
those names -> NumPy dtypes (bfloat16, float8 and 4-bit types come from ml_dtypes)."""

from __future__ import annotations

import numpy as np

#: MLIR builtin and torch-dialect element types -> dtype names. Signless and signed integers are
#: signed; the runtime hands unsigned data back as signed and `as_declared` restores it.
BY_ELEMENT = {
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "bf16": "bfloat16",
    "f8E4M3FN": "float8_e4m3fn",
    "f8E5M2": "float8_e5m2",
    "f8E4M3FNUZ": "float8_e4m3fnuz",
    "f8E5M2FNUZ": "float8_e5m2fnuz",
    "i1": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "si8": "int8",
    "si16": "int16",
    "si32": "int32",
    "si64": "int64",
    "ui8": "uint8",
    "ui16": "uint16",
    "ui32": "uint32",
    "ui64": "uint64",
}
#: Dtype names that need ml_dtypes.
EXTENDED = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype a signature's dtype name stands for."""
    if name in EXTENDED:
        import ml_dtypes

        scalar: type[np.generic] = getattr(ml_dtypes, name)
        return np.dtype(scalar)
    return np.dtype(name)


def as_declared(array: np.ndarray, name: str) -> np.ndarray:
    """`array` as the declared dtype when the runtime returned the same bits under another
    integer signedness (IREE's integers are signless): a view (the runtime's results keep their
    memory alive through their base, `jit.vmcall.host_array`)."""
    want = numpy_dtype(name)
    if array.dtype == want or array.dtype.itemsize != want.itemsize or array.dtype.kind not in "iub" or want.kind not in "iub":
        return array
    return array.view(want)
