"""Framework tensors as kernel arguments and results, through DLPack, without copies on the CPU.

Any object with `__dlpack__` (torch CPU tensors, JAX CPU arrays, ...) is taken as a NumPy
view of the same memory (`numpy.from_dlpack`). What NumPy cannot view is refused with an
`ArgumentTypeError` that says what to do: a tensor outside host memory (copy it to the host
first), one that requires grad (detach it), an element type NumPy has not (bfloat16, ...).
A torch tensor with its negative or conjugate bit set (a lazy view such as `z.conj().imag` or
`torch._neg_view(x)`, whose memory holds the values before negation or conjugation, a bit that
`numpy.from_dlpack` would ignore or torch refuses to export) is resolved first (`resolve_neg()`,
`resolve_conj()`: a copy with the values it stands for).
When every input of a call is a torch tensor, the results are torch tensors over portkern's
result arrays (`torch.from_dlpack`). Nothing here imports a framework: a torch tensor comes
with torch already imported.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import numpy as np

from portkern.base.errors import ArgumentTypeError, brief

#: A function that turns a call's result array into the caller's framework's tensor.
Wrap = Callable[[np.ndarray], object]

#: DLPack's device type for host memory (kDLCPU).
DLPACK_CPU = 1


def is_tensor(value: object) -> bool:
    """Whether a value is a framework tensor that is not a NumPy array (its type has `__dlpack__`)."""
    return not isinstance(value, (np.ndarray, np.generic)) and hasattr(type(value), "__dlpack__")


def as_array(kernel: str, index: int, value: object) -> np.ndarray:
    """A NumPy view of a framework tensor's memory (no copy), or an ArgumentTypeError."""
    kind = kind_name(value)
    device = dlpack_device(value)
    if device is not None and device[0] != DLPACK_CPU:
        where = getattr(value, "device", f"DLPack device type {device[0]}")
        raise ArgumentTypeError(
            f"{kernel}() argument {index} is a {kind} on {where}; kernels take host memory (copy it first, e.g. tensor.cpu())"
        )
    if getattr(value, "requires_grad", False) is True:
        raise ArgumentTypeError(f"{kernel}() argument {index} is a {kind} that requires grad; pass tensor.detach()")
    try:
        return np.from_dlpack(_resolved(kernel, index, kind, value))
    except (BufferError, RuntimeError, TypeError, ValueError, AttributeError) as exc:
        reason = brief(exc, None, sep=" ", limit=200) or type(exc).__name__
        raise ArgumentTypeError(f"{kernel}() argument {index}: a {kind} that NumPy cannot view ({reason})") from None


def result_wrapper(args: Sequence[object]) -> Wrap | None:
    """How to hand results to a caller whose every input is a torch tensor (None: as NumPy arrays)."""
    torch = sys.modules.get("torch")
    if torch is None or not args:
        return None
    if not all(type(a).__module__.partition(".")[0] == "torch" and isinstance(a, torch.Tensor) for a in args):
        return None

    def wrap(array: np.ndarray) -> object:
        if not array.flags.writeable:
            array = array.copy()  # DLPack cannot carry read-only memory to torch
        return torch.from_dlpack(array)

    return wrap


def _resolved(kernel: str, index: int, kind: str, value: object) -> Any:
    """A torch tensor (of any subclass) with its conjugate and negative bits applied (a copy where one is set); any
    other value as it is. An ArgumentTypeError where a bit is set and cannot be applied."""
    torch = sys.modules.get("torch")  # a torch tensor (of a subclass too) comes with torch imported
    if torch is None or not isinstance(value, torch.Tensor):
        return value
    for bit, name, done, resolve in (("is_conj", "conjugate", "conjugated", "resolve_conj"), ("is_neg", "negative", "negated", "resolve_neg")):
        try:
            if not _bit_set(value, bit):
                continue
            value = getattr(value, resolve)()
            if not _bit_set(value, bit):
                continue
            cause = f"{resolve}() left it set"
        except Exception as exc:  # noqa: BLE001 - a tensor type whose bit cannot be read or applied is refused
            cause = brief(exc, None, sep=" ", limit=200) or type(exc).__name__
        raise ArgumentTypeError(
            f"{kernel}() argument {index} is a {kind} with the {name} bit set (a lazily {done} "
            f"view, whose memory holds the values before that), which could not be applied ({cause}); pass tensor.{resolve}()"
        )
    return value


def _bit_set(value: object, bit: str) -> bool:
    test = getattr(value, bit, None)
    return bool(test()) if callable(test) else False


def dlpack_device(value: Any) -> tuple[int, int] | None:
    """A framework tensor's DLPack (device type, device id); None where it does not say."""
    try:
        kind, ordinal = value.__dlpack_device__()
        return int(kind), int(ordinal)
    except Exception:  # noqa: BLE001 - no or an unusual __dlpack_device__: from_dlpack decides
        return None


def kind_name(value: object) -> str:
    """A tensor's kind as messages name it: its top-level package and class (`torch.Tensor`)."""
    cls = type(value)
    return f"{cls.__module__.partition('.')[0]}.{cls.__name__}"
