"""Checking kernel arguments against the signature before anything runs."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from portkern.errors import ArgumentShapeError, ArgumentTypeError
from portkern.portable.bundle import Signature


def check_arguments(kernel: str, signature: Signature, args: Sequence[object]) -> list[np.ndarray]:
    """The arguments as C-contiguous arrays, or a TypeError/ValueError naming the bad one."""
    expected = signature.inputs
    if len(args) != len(expected):
        raise ArgumentTypeError(
            f"{kernel}() takes {len(expected)} argument{'s' if len(expected) != 1 else ''} "
            f"({', '.join(map(str, expected))}), got {len(args)}"
        )
    arrays = []
    for index, (arg, spec) in enumerate(zip(args, expected)):
        if not isinstance(arg, (np.ndarray, np.generic)):
            raise ArgumentTypeError(
                f"{kernel}() argument {index} must be a numpy array of {spec}, got {type(arg).__name__}"
            )
        array = np.asarray(arg)
        if array.dtype != np.dtype(spec.dtype):
            raise ArgumentTypeError(
                f"{kernel}() argument {index} must have dtype {spec.dtype}, got {array.dtype}"
            )
        if array.ndim != len(spec.shape) or any(
            want is not None and want != have for want, have in zip(spec.shape, array.shape)
        ):
            wanted = "x".join("?" if d is None else str(d) for d in spec.shape) or "scalar"
            got = "x".join(map(str, array.shape)) or "scalar"
            raise ArgumentShapeError(f"{kernel}() argument {index} must have shape {wanted}, got {got}")
        arrays.append(np.ascontiguousarray(array))
    return arrays
