"""One kernel call on host arrays on a GPU driver: each argument copied to the device and each
result back through pinned host buffers kept for the next call.

`iree.runtime`'s own route for host arrays allocates fresh pinned host memory for every
transfer (IREE's `transfer_h2d` stages through a new host buffer), which costs far more than
the copy. Here each executable keeps, per argument and per result, one pinned staging buffer
and (per argument) one device buffer of the size the last call needed; a call copies the
host array into the staging buffer, queues the device-side copy, runs, and copies each result
out of its staging buffer into a new NumPy array. Calls on one executable are serialised (they
share the buffers). An executable keeps at most `KEEP_BYTES`; buffers beyond that are made for
the call and dropped.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from portkern.base.errors import KernelRuntimeError
from portkern.jit.vmcall import element_type, native_runtime

#: Bytes of staging and device buffers one executable keeps between calls, at most.
KEEP_BYTES = 64 << 20


class GpuCall:
    """An entry function of a module loaded on a GPU driver, callable on C-contiguous host arrays."""

    def __init__(self, entry: str, vm_context, vm_function, device) -> None:
        hal = native_runtime()
        self.entry = entry
        self._context = vm_context
        self._function = vm_function
        self._device = device
        self._allocator = device.allocator
        self._hal = hal
        self._device_memory = int(hal.MemoryType.DEVICE_LOCAL)
        self._device_usage = int(hal.BufferUsage.DEFAULT)
        self._host_memory = int(hal.MemoryType.HOST_LOCAL | hal.MemoryType.DEVICE_VISIBLE)
        self._host_usage = int(hal.BufferUsage.TRANSFER | hal.BufferUsage.MAPPING_SCOPED)
        self._lock = threading.Lock()
        #: (role, index) -> a buffer of the size the last call needed ("in", "dev", "out").
        self._kept: dict[tuple[str, int], Any] = {}
        self._kept_bytes = 0
        self._element_types: dict[np.dtype, object] = {}

    def __call__(self, arrays) -> list[np.ndarray]:
        """Run on C-contiguous arrays; the results as new NumPy arrays."""
        hal = self._hal
        with self._lock:
            try:
                semaphore = self._device.create_semaphore(0)
                copies = 0
                args = hal.VmVariantList(len(arrays))
                for index, array in enumerate(arrays):
                    target = self._buffer("dev", index, array.nbytes)
                    if array.nbytes:
                        staging = self._buffer("in", index, array.nbytes)
                        np.copyto(staging.map().asarray(array.shape, array.dtype), array)
                        self._copy(staging, target, semaphore, copies)
                        copies += 1
                    args.push_ref(hal.HalBufferView(target, array.shape, self._element_type(array.dtype)).ref)
                if copies:
                    hal.HalFence.create_at(semaphore, copies).wait()
                results = hal.VmVariantList(1)
                self._context.invoke(self._function, args, results)
                return self._download(results)
            except (RuntimeError, ValueError, IndexError) as exc:  # IndexError: IREE's OUT_OF_RANGE
                raise KernelRuntimeError(f"{self.entry}: {exc}") from None

    def _download(self, results) -> list[np.ndarray]:
        hal = self._hal
        semaphore = self._device.create_semaphore(0)
        staged: list = []
        copies = 0
        for index in range(len(results)):
            value = results.get_variant(index)
            if not isinstance(value, hal.VmRef):
                staged.append(np.asarray(value))
                continue
            view = value.deref(hal.HalBufferView, True)
            if view is None:
                raise KernelRuntimeError(f"{self.entry}: result {index} is not a tensor ({value!r})")
            dtype = np.dtype(hal.HalElementType.map_to_dtype(view.element_type))
            source = view.get_buffer()
            if not source.byte_length():
                staged.append(np.empty(tuple(view.shape), dtype))
                continue
            staging = self._buffer("out", index, source.byte_length())
            self._copy(source, staging, semaphore, copies)
            copies += 1
            staged.append((staging, tuple(view.shape), dtype))
        if copies:
            hal.HalFence.create_at(semaphore, copies).wait()
        return [np.array(s[0].map().asarray(s[1], s[2])) if isinstance(s, tuple) else s for s in staged]

    def _copy(self, source, target, semaphore, done: int) -> None:
        """Queue a whole-buffer copy after `done` earlier ones (one semaphore counts them)."""
        hal = self._hal
        self._device.queue_copy(
            source, target, wait_semaphores=hal.HalFence.create_at(semaphore, done), signal_semaphores=hal.HalFence.create_at(semaphore, done + 1)
        )

    def _buffer(self, role: str, index: int, size: int):
        """A buffer for `role` ("in"/"out": pinned host memory, "dev": device memory) of `size` bytes
        (at least one), kept for the next call while the executable keeps at most `KEEP_BYTES`."""
        size = max(size, 1)
        key = (role, index)
        kept = self._kept.get(key)
        if kept is not None and kept.byte_length() == size:
            return kept
        memory, usage = (self._device_memory, self._device_usage) if role == "dev" else (self._host_memory, self._host_usage)
        buffer = self._allocator.allocate_buffer(memory_type=memory, allowed_usage=usage, allocation_size=size)
        if kept is not None:
            self._kept_bytes -= kept.byte_length()
            del self._kept[key]
        if self._kept_bytes + size <= KEEP_BYTES:
            self._kept[key] = buffer
            self._kept_bytes += size
        return buffer

    def _element_type(self, dtype: np.dtype):
        found = self._element_types.get(dtype)
        if found is None:
            try:
                found = self._element_types[dtype] = element_type(self._hal, dtype)
            except (KeyError, ValueError, TypeError) as exc:
                raise KernelRuntimeError(f"{self.entry}: arrays of {dtype} cannot be passed to IREE ({exc})") from None
        return found
