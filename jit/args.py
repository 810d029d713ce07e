"""Checking kernel arguments against the signature before anything runs."""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence, cast

import numpy as np

from portkern.base.errors import ArgumentShapeError, ArgumentTypeError, LaunchSpecError
from portkern.jit.tensors import as_array, is_tensor
from portkern.jit.vmcall import contiguous
from portkern.portable.bundle import Signature, TensorSpec
from portkern.portable.contract import UncheckedShapesWarning
from portkern.portable.dtypes import numpy_dtype

if TYPE_CHECKING:  # OpenCL launch descriptions: loaded with the OpenCL kernels that have them
    from portkern.portable.expr import Expr
    from portkern.portable.launch import Launch


def check_arguments(kernel: str, signature: Signature, args: Sequence[object], unchecked: bool = False) -> list[np.ndarray]:
    """The arguments (NumPy arrays, or framework tensors with `__dlpack__`, viewed without a
    copy) as C-contiguous arrays, or a TypeError/ValueError naming the bad one (two for a
    break of the shape contract); a masked array that masks anything is refused, since its mask would be lost.
    `unchecked`: the kernel has dynamic shapes and nothing checks them (no contract, no launch
    description); the first such call warns (`warn_unchecked`)."""
    check_count(kernel, signature, args)
    expected = signature.inputs
    arrays = []
    for index, (arg, spec) in enumerate(zip(args, expected)):
        if is_tensor(arg):
            arg = as_array(kernel, index, arg)
        if not isinstance(arg, (np.ndarray, np.generic)):
            raise ArgumentTypeError(
                f"{kernel}() argument {index} must be a numpy array of {spec}, got {type(arg).__name__}"
                + (f" (pass a scalar as a NumPy scalar: np.{numpy_dtype(spec.dtype).name}({arg!r}))" if not spec.shape and isinstance(arg, (int, float, bool)) else "")
            )
        if is_masked(arg):
            raise ArgumentTypeError(
                f"{kernel}() argument {index} is a NumPy masked array: a kernel would ignore its mask; "
                f"pass arg.filled(value) to replace the masked elements, or arg.data to use the values under the mask"
            )
        array = np.asarray(arg)
        if array.dtype != numpy_dtype(spec.dtype):
            raise ArgumentTypeError(
                f"{kernel}() argument {index} must have dtype {spec.dtype}, got {array.dtype}"
            )
        check_shape(kernel, index, spec, array.shape)
        arrays.append(contiguous(array))  # a copy where one is needed, aligned so the call uses it in place
    if signature.contract is not None:
        signature.contract.bind(kernel, [a.shape for a in arrays])
    elif unchecked:
        warn_unchecked(kernel, signature)
    return arrays


def check_count(kernel: str, signature: Signature, args: Sequence[object]) -> None:
    """An ArgumentTypeError unless there is one argument per input of the signature."""
    expected = signature.inputs
    if len(args) != len(expected):
        raise ArgumentTypeError(
            f"{kernel}() takes {len(expected)} argument{'s' if len(expected) != 1 else ''} "
            f"({', '.join(map(str, expected))}), got {len(args)}"
        )


def check_shape(kernel: str, index: int, spec: TensorSpec, shape: tuple[int, ...]) -> None:
    """An ArgumentShapeError unless argument `index`'s shape fits its input's (None: any size)."""
    if len(shape) != len(spec.shape) or any(want is not None and want != have for want, have in zip(spec.shape, shape)):
        wanted = "x".join("?" if d is None else str(d) for d in spec.shape) or "scalar"
        got = "x".join(map(str, shape)) or "scalar"
        raise ArgumentShapeError(f"{kernel}() argument {index} must have shape {wanted}, got {got}")


#: Signatures whose first unchecked call has been reported.
_WARNED: set[int] = set()


def warn_unchecked(kernel: str, signature: Signature) -> None:
    """Report, once per signature, that a kernel with dynamic shapes runs without a shape contract."""
    if id(signature) in _WARNED:
        return
    _WARNED.add(id(signature))
    warnings.warn(
        f"{kernel}() has no shape contract (built `unchecked: true`, or by an older portkern): its argument sizes "
        f"are not checked against each other, and sizes the kernel does not expect may read past its arguments",
        UncheckedShapesWarning,
        stacklevel=3,
    )


def is_masked(value: object) -> bool:
    """Whether `value` is a NumPy masked array with at least one element masked (only possible
    once `numpy.ma` is imported); one that masks nothing loses nothing and is used as an array."""
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(value, ma.MaskedArray) and bool(ma.getmaskarray(value).any())


#: Per input, the dtype and shape a call's argument must have exactly (see `static_inputs`).
StaticInputs = tuple[tuple[np.dtype, tuple[int, ...]], ...]


def static_inputs(signature: Signature) -> StaticInputs | None:
    """Each input's dtype and shape when every input shape is static, else None: a call whose
    arguments are C-contiguous arrays of exactly these needs no other check."""
    if any(None in spec.shape for spec in signature.inputs):
        return None
    try:
        return tuple((numpy_dtype(spec.dtype), cast("tuple[int, ...]", spec.shape)) for spec in signature.inputs)
    except (TypeError, ImportError):  # a dtype this NumPy lacks: `check_arguments` says so
        return None


def exact_arguments(expected: StaticInputs, args: Sequence[Any]) -> list[np.ndarray] | None:
    """The arguments, when each is a C-contiguous NumPy array of exactly the expected dtype and
    shape; None otherwise (`check_arguments` then converts them or says what is wrong)."""
    if len(args) != len(expected):
        return None
    for arg, (dtype, shape) in zip(args, expected):
        if type(arg) is not np.ndarray or arg.dtype != dtype or arg.shape != shape or not arg.flags.c_contiguous:
            return None
    return list(args)


class BoundLaunch(NamedTuple):
    """A launch description bound to the caller's arrays."""

    #: Symbol values read from the input shapes.
    symbols: dict[str, int]
    #: Result shapes, by argument name.
    shapes: dict[str, tuple[int, ...]]
    #: Scalar values computed from shapes, by argument name.
    scalars: dict[str, np.generic]
    global_size: tuple[int, ...]


def bind_launch(
    kernel: str, launch: Launch, local: Sequence[int] | None, arrays: Sequence[np.ndarray], params: Sequence[tuple[str, int]] = ()
) -> BoundLaunch:
    """Bind an OpenCL launch description to checked input arrays, or refuse them
    (`params`: the values of a parameter space's point, symbols beside the shapes').

    Every input dimension must match its expression, every `requires`
    condition must hold and the global size must be a whole number of
    work-groups; otherwise an ArgumentShapeError names the values involved.
    """
    inputs = dict(zip((a.name for a in launch.inputs), arrays))
    shapes = {arg.name: inputs[arg.name].shape for arg in launch.inputs if arg.is_buffer}
    symbols: dict[str, int] = {}
    for arg in launch.inputs:
        for axis, dim in enumerate(arg.shape):
            if dim.is_symbol:
                symbols.setdefault(dim.text, int(shapes[arg.name][axis]))
    symbols.update(params)

    def value(item: Expr, what: str) -> int:
        try:
            return item.evaluate(symbols, shapes)
        except LaunchSpecError as exc:
            raise ArgumentShapeError(f"{kernel}(): {what}: {exc} ({_values(symbols)})") from None

    for index, arg in enumerate(launch.inputs):
        if arg.is_buffer and tuple(value(d, f"{arg.name}.shape") for d in arg.shape) != shapes[arg.name]:
            wanted = "x".join(d.text for d in arg.shape)
            got = "x".join(map(str, shapes[arg.name]))
            raise ArgumentShapeError(f"{kernel}() argument {index} ({arg.name}) must have shape {wanted}, got {got} ({_values(symbols)})")
    for condition in launch.requires:
        if not value(condition, "requires"):
            raise ArgumentShapeError(f"{kernel}() arguments break `{condition}` ({_values(symbols)})")
    results = {}
    for arg in launch.outputs:
        if arg.role == "out":
            results[arg.name] = tuple(value(d, f"shape of {arg.name}") for d in arg.shape)
            if any(d < 0 for d in results[arg.name]):
                raise ArgumentShapeError(f"{kernel}(): result {arg.name} would have shape {results[arg.name]} ({_values(symbols)})")
    scalars = {a.name: _scalar(kernel, a.name, a.dtype, value(a.value, a.name)) for a in launch.args if a.value is not None}
    global_size = tuple(value(g, "global size") for g in launch.global_size)
    if any(g < 0 for g in global_size):
        raise ArgumentShapeError(f"{kernel}(): negative global size {global_size} ({_values(symbols)})")
    if local is not None and any(g % size for g, size in zip(global_size, local)):
        raise ArgumentShapeError(
            f"{kernel}(): global size {global_size} is not a whole number of work-groups of {tuple(local)} ({_values(symbols)})"
        )
    if 0 in global_size and any(int(np.prod(s)) for s in results.values()):
        raise ArgumentShapeError(f"{kernel}(): global size {global_size} is empty, but the results are not ({_values(symbols)})")
    return BoundLaunch(symbols, results, scalars, global_size)


def _scalar(kernel: str, name: str, dtype: str, value: int) -> np.generic:
    kind = np.dtype(dtype)
    if kind.kind in "iu":
        info = np.iinfo(kind)
        if not info.min <= value <= info.max:
            raise ArgumentShapeError(f"{kernel}(): argument {name} = {value} does not fit {dtype}")
    return kind.type(value)


def _values(symbols: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(symbols.items())) or "no symbols"
