"""One IREE runtime call per kernel call on a local (CPU) driver: host arrays in, host arrays out.

`iree.runtime`'s FunctionInvoker converts arguments and results generically, in Python, and
copies each argument into a device buffer with the GIL released; of a 30 us call, about
10 us went to that glue. Here the VM argument list is built directly. A large argument
whose memory IREE may use as it is (64-byte aligned, IREE's buffer alignment contract, and
writable) is wrapped without a copy; others are copied by IREE (which releases the GIL for
the copy). The copy cannot be avoided: the runtime would import unaligned memory, but the
compiler marks every buffer binding of the code it generates `alignment(64)` and lets LLVM
assume it (`memref.assume_alignment`), so such code on unaligned memory is undefined (aligned
vector loads fault). Each unaligned argument thus costs one copy of itself for the length of
the call, no more; NumPy's own large arrays are 16 bytes past a 64-byte boundary on glibc
(malloc's header), so most of them pay it. An argument that must be copied anyway (not
C-contiguous) is copied once, to aligned memory (`contiguous`), and then wrapped. The call
then releases the GIL once more, for the invocation itself. Results are
NumPy arrays over the host memory of the buffers the call returned (on a local driver,
device memory is host memory), which every view of them keeps valid (`host_array`); a
result that shares memory with an argument or an earlier result is copied.
"""

from __future__ import annotations

import numpy as np

from portkern.base.errors import KernelRuntimeError

#: IREE's heap buffer alignment (IREE_HAL_HEAP_BUFFER_ALIGNMENT): code may assume it of every buffer.
ALIGNMENT = 64
#: Arguments this large or larger are wrapped when they can be (smaller ones copy faster than
#: their alignment is checked).
WRAP_BYTES = 1 << 16
#: Drivers whose device memory is host memory (where wrapping and mapping apply).
LOCAL_DRIVERS = ("local-sync", "local-task")
#: The IREE drivers of GPUs (host arrays through `jit.gpucall`; framework tensors in their memory: `jit.device_tensors`).
GPU_DRIVERS = ("cuda", "hip")


def native_runtime():
    """IREE's native runtime module: the classes `iree.runtime` re-exports (`VmInstance`,
    `VmContext`, `VmModule`, `HalDevice`, ...), imported without the package's Python layer.

    Importing `iree.runtime` runs its `__init__`, which imports every Python helper of the
    package (benchmark tools over subprocess and tempfile, ml_dtypes, the function-call glue):
    most of the runtime's import time, none of it on a CPU call's path (`VmCall`). The
    native module is reached as `iree.runtime._binding` reaches it, through
    `iree._runtime.libs` (a private module of the IREE wheel: there is no public import of the
    native module alone), which also honours `IREE_PY_RUNTIME`. Paths that need the Python
    layer (device arrays, other arguments than NumPy arrays) import `iree.runtime` itself; both
    name the same native classes."""
    from iree._runtime.libs import _runtime

    return _runtime


class VmCall:
    """An entry function of a loaded module, callable on C-contiguous NumPy arrays."""

    def __init__(self, entry: str, vm_context, vm_function, device) -> None:
        _binding = native_runtime()

        self.entry = entry
        self._context = vm_context
        self._function = vm_function
        self._device = device
        self._allocator = device.allocator
        self._hal = _binding
        self._memory = int(_binding.MemoryType.HOST_LOCAL | _binding.MemoryType.DEVICE_VISIBLE)
        self._usage = int(_binding.BufferUsage.DEFAULT)
        #: NumPy dtype -> HAL element type, and back (filled as calls meet them).
        self._element_types: dict[np.dtype, object] = {}
        self._dtypes: dict[int, np.dtype] = {}

    def __call__(self, arrays) -> list[np.ndarray]:
        """Run on C-contiguous arrays; the results as NumPy arrays."""
        hal = self._hal
        args = hal.VmVariantList(len(arrays))
        for array in arrays:
            args.push_ref(self._buffer_view(array).ref)
        results = hal.VmVariantList(1)
        try:
            self._context.invoke(self._function, args, results)
        except (RuntimeError, ValueError, IndexError) as exc:  # IndexError: IREE's OUT_OF_RANGE
            raise KernelRuntimeError(f"{self.entry}: {exc}") from None
        return distinct([self._result(results, index) for index in range(len(results))], arrays)

    def _buffer_view(self, array: np.ndarray):
        hal = self._hal
        kind = self._kind(array.dtype)
        if array.nbytes >= WRAP_BYTES and array.flags.writeable and not array.ctypes.data % ALIGNMENT:
            buffer = self._allocator.import_host_allocation(array, self._memory, self._usage)
            return hal.HalBufferView(buffer, array.shape, kind)
        return self._allocator.allocate_buffer_copy(self._memory, self._usage, self._device, array, kind)

    def _kind(self, dtype: np.dtype):
        """The HAL element type of arrays of `dtype`; a KernelRuntimeError for one IREE cannot take."""
        kind = self._element_types.get(dtype)
        if kind is None:
            try:
                kind = self._element_types[dtype] = _element_type(self._hal, dtype)
            except (KeyError, ValueError, TypeError) as exc:
                raise KernelRuntimeError(f"{self.entry}: arrays of {dtype} cannot be passed to IREE ({exc})") from None
        return kind

    def _tensor(self, results, index: int):
        """Result `index` as a HAL buffer view, or as a NumPy array where the call returned a plain value."""
        hal = self._hal
        value = results.get_variant(index)
        if not isinstance(value, hal.VmRef):
            return np.asarray(value)
        view = value.deref(hal.HalBufferView, True)
        if view is None:
            raise KernelRuntimeError(f"{self.entry}: result {index} is not a tensor ({value!r})")
        return view

    def _dtype(self, view) -> np.dtype:
        """The NumPy dtype of a result buffer view's elements."""
        kind = view.element_type
        dtype = self._dtypes.get(int(kind))
        if dtype is None:
            dtype = self._dtypes[int(kind)] = np.dtype(self._hal.HalElementType.map_to_dtype(kind))
        return dtype

    def _result(self, results, index: int) -> np.ndarray:
        view = self._tensor(results, index)
        if isinstance(view, np.ndarray):
            return view
        return host_array(view.map().asarray(view.shape, self._dtype(view)))


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose memory starts on an `ALIGNMENT` boundary (so
    a kernel call uses it in place)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def contiguous(array: np.ndarray) -> np.ndarray:
    """`array` itself when C-contiguous, else its one copy, C-contiguous and aligned: a large
    argument a call must copy is copied once, not once here and again into IREE's memory."""
    if array.flags.c_contiguous:
        return array
    if array.nbytes < WRAP_BYTES:
        return np.array(array, order="C")
    copy = aligned_empty(array.shape, array.dtype)
    np.copyto(copy, array)
    return copy


#: NumPy dtype names -> HAL element type names, as `iree.runtime.array_interop` maps them.
_ELEMENT_TYPES = {
    "float16": "FLOAT_16", "float32": "FLOAT_32", "float64": "FLOAT_64", "bool": "BOOL_8",
    "int8": "SINT_8", "int16": "SINT_16", "int32": "SINT_32", "int64": "SINT_64",
    "uint8": "UINT_8", "uint16": "UINT_16", "uint32": "UINT_32", "uint64": "UINT_64",
}


def _element_type(hal, dtype: np.dtype):
    """The HAL element type of a NumPy dtype (others than the plain ones: `iree.runtime`'s own mapping)."""
    name = _ELEMENT_TYPES.get(dtype.name) if dtype.isnative else None
    if name is not None:
        return getattr(hal.HalElementType, name)
    from iree.runtime.array_interop import map_dtype_to_hal_element_type

    return map_dtype_to_hal_element_type(dtype)


def host_array(array: np.ndarray) -> np.ndarray:
    """`array` (from IREE's `MappedMemory.asarray`, over runtime memory) as an array that every
    view of it keeps valid: its base is a memoryview that holds `array`.

    `asarray` ties the mapping's life to the array it returns, which is a view of an inner
    array over a memoryview that owns nothing; NumPy makes a view's base the innermost array
    that owns its data or whose base is of another type, here the inner array. So a view
    (`.view(np.uint64)`, a reshape) outlived the returned array and read memory that later calls
    reused (test_mul_uint64 of the ONNX node suite)."""
    if not array.size:
        return array
    try:
        kept = np.asarray(array.data)  # the array's memoryview
    except ValueError:  # a dtype the buffer protocol cannot state (bfloat16 and other ml_dtypes)
        kept = np.asarray(_Exported(array))
    return kept if kept.dtype == array.dtype else kept.view(array.dtype)


class _Exported:
    """An array's memory, by the array interface: the base of arrays made from it, holding it."""

    __slots__ = ("__array_interface__", "_array")

    def __init__(self, array: np.ndarray) -> None:
        self.__array_interface__ = {**array.__array_interface__, "typestr": f"|V{array.dtype.itemsize}", "descr": [("", f"|V{array.dtype.itemsize}")]}
        self._array = array


def distinct(arrays: list[np.ndarray], beside=()) -> list[np.ndarray]:
    """The arrays, each one copied if it shares memory with one of `beside` or an earlier one."""
    out: list[np.ndarray] = []
    for array in arrays:
        out.append(array.copy() if any(np.may_share_memory(array, seen) for seen in (*beside, *out)) else array)
    return out
