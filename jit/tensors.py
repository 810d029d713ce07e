"""Framework tensors as kernel arguments and results, through DLPack, without copies on the CPU.

Any object with `__dlpack__` (torch CPU tensors, JAX CPU arrays, CuPy, ...) is taken as a
NumPy view of the same memory (`numpy.from_dlpack`). What NumPy cannot view is refused
with an `ArgumentTypeError` that says what to do: a tensor on a GPU (copy it to the host
first), one that requires grad (detach it). A non-contiguous tensor is treated as a
non-contiguous array is: copied to a contiguous one. When every input of a call is a torch
tensor, the results are torch tensors sharing memory with portkern's result arrays.
Nothing here imports a framework: a torch tensor comes with torch already imported.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

import numpy as np

from portkern.errors import ArgumentTypeError

#: A function that turns a call's result arrays into the caller's framework's tensors.
Wrap = Callable[[np.ndarray], object]


def is_tensor(value: object) -> bool:
    """Whether a value is a framework tensor that is not a NumPy array (it has `__dlpack__`)."""
    return not isinstance(value, (np.ndarray, np.generic)) and hasattr(type(value), "__dlpack__")


def as_array(kernel: str, index: int, value: object) -> np.ndarray:
    """A NumPy view of a framework tensor's memory (no copy), or an ArgumentTypeError."""
    device = _device(value)
    if device is not None and device != 1:  # kDLCPU
        where = getattr(value, "device", device)
        raise ArgumentTypeError(
            f"{kernel}() argument {index} is a {_kind(value)} on {where}; kernels on this device take host memory "
            f"(copy it first, e.g. tensor.cpu())"
        )
    if getattr(value, "requires_grad", False):
        raise ArgumentTypeError(f"{kernel}() argument {index} is a {_kind(value)} that requires grad; pass tensor.detach()")
    try:
        return np.from_dlpack(value)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        raise ArgumentTypeError(f"{kernel}() argument {index}: a {_kind(value)} that NumPy cannot view ({' '.join(str(exc).split())[:200]})") from None


def result_wrapper(args: Sequence[object]) -> Wrap | None:
    """How to return results to a caller whose every input is a torch tensor (None: as NumPy arrays)."""
    if not args or not all(type(a).__module__ == "torch" and type(a).__name__ in ("Tensor", "Parameter") for a in args):
        return None
    torch = sys.modules.get("torch")
    if torch is None:
        return None

    def wrap(array: np.ndarray) -> object:
        if not array.flags.writeable:
            return torch.from_numpy(array.copy())  # DLPack cannot say read-only: such a result is copied
        return torch.from_numpy(array)

    return wrap


def _device(value: object) -> int | None:
    try:
        return int(value.__dlpack_device__()[0])
    except Exception:  # noqa: BLE001 - no or an unusual __dlpack_device__: let from_dlpack decide
        return None


def _kind(value: object) -> str:
    cls = type(value)
    return f"{cls.__module__.split('.')[0]}.{cls.__name__}"
