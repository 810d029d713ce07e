"""One IREE runtime call per kernel call on a local (CPU) driver: host arrays in, host arrays out.

`iree.runtime`'s FunctionInvoker converts arguments and results generically, in Python, and
copies each argument into a device buffer with the GIL released; of a 30 us call, about
10 us went to that glue. Here the VM argument list is built directly. A large argument
whose memory IREE may use as it is (64-byte aligned, IREE's buffer alignment contract, and
writable) is wrapped without a copy; others are copied by IREE (which releases the GIL for
the copy). The call then releases the GIL once more, for the invocation itself. Results are
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


class VmCall:
    """An entry function of a loaded module, callable on C-contiguous NumPy arrays."""

    def __init__(self, entry: str, vm_context, vm_function, device) -> None:
        from iree.runtime import _binding

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
        element_type = self._element_types.get(array.dtype)
        if element_type is None:
            from iree.runtime.array_interop import map_dtype_to_hal_element_type

            try:
                element_type = self._element_types[array.dtype] = map_dtype_to_hal_element_type(array.dtype)
            except (KeyError, ValueError, TypeError) as exc:
                raise KernelRuntimeError(f"{self.entry}: arrays of {array.dtype} cannot be passed to IREE ({exc})") from None
        if array.nbytes >= WRAP_BYTES and array.flags.writeable and not array.ctypes.data % ALIGNMENT:
            buffer = self._allocator.import_host_allocation(array, self._memory, self._usage)
            return hal.HalBufferView(buffer, array.shape, element_type)
        return self._allocator.allocate_buffer_copy(self._memory, self._usage, self._device, array, element_type)

    def _result(self, results, index: int) -> np.ndarray:
        hal = self._hal
        value = results.get_variant(index)
        if not isinstance(value, hal.VmRef):
            return np.asarray(value)
        view = value.deref(hal.HalBufferView, True)
        if view is None:
            raise KernelRuntimeError(f"{self.entry}: result {index} is not a tensor ({value!r})")
        kind = view.element_type
        dtype = self._dtypes.get(int(kind))
        if dtype is None:
            dtype = self._dtypes[int(kind)] = np.dtype(hal.HalElementType.map_to_dtype(kind))
        return host_array(view.map().asarray(view.shape, dtype))


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
