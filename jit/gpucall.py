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
from portkern.jit.vmcall import VmCall

#: Bytes of staging and device buffers one executable keeps between calls, at most.
KEEP_BYTES = 64 << 20


class GpuCall(VmCall):
    """An entry function of a module loaded on a GPU driver, callable on C-contiguous host arrays
    (`VmCall`'s element types and results; its own transfers). Host buffers are `VmCall`'s memory
    type (host memory the device reaches), with copy and mapping usage."""

    def __init__(self, entry: str, vm_context, vm_function, device) -> None:
        super().__init__(entry, vm_context, vm_function, device)
        hal = self._hal
        self._device_memory = int(hal.MemoryType.DEVICE_LOCAL)
        self._device_usage = int(hal.BufferUsage.DEFAULT)
        self._host_usage = int(hal.BufferUsage.TRANSFER | hal.BufferUsage.MAPPING_SCOPED)
        self._lock = threading.Lock()
        #: (role, index) -> a buffer of the size the last call needed ("in", "dev", "out").
        self._kept: dict[tuple[str, int], Any] = {}
        self._kept_bytes = 0

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
                    args.push_ref(hal.HalBufferView(target, array.shape, self._kind(array.dtype)).ref)
                if copies:
                    hal.HalFence.create_at(semaphore, copies).wait()
                results = hal.VmVariantList(1)
                self._context.invoke(self._function, args, results)
                return self._download(results)
            except (RuntimeError, ValueError, IndexError) as exc:  # IndexError: IREE's OUT_OF_RANGE
                raise KernelRuntimeError(f"{self.entry}: {exc}") from None

    def _download(self, results) -> list[np.ndarray]:
        """Every result copied to a new NumPy array, through the kept host buffers (one wait for all copies)."""
        hal = self._hal
        semaphore = self._device.create_semaphore(0)
        out: list[np.ndarray] = []
        staged: list[tuple[int, Any, Any, np.dtype]] = []  # (position in out, host buffer, view, dtype)
        for index in range(len(results)):
            view = self._tensor(results, index)
            if isinstance(view, np.ndarray):
                out.append(view)
                continue
            dtype = self._dtype(view)
            source = view.get_buffer()
            out.append(np.empty(tuple(view.shape), dtype))
            if source.byte_length():
                staging = self._buffer("out", index, source.byte_length())
                self._copy(source, staging, semaphore, len(staged))
                staged.append((len(out) - 1, staging, view, dtype))
        if staged:
            hal.HalFence.create_at(semaphore, len(staged)).wait()
        for position, staging, view, dtype in staged:
            out[position] = np.array(staging.map().asarray(view.shape, dtype))
        return out

    def _copy(self, source, target, semaphore, done: int) -> None:
        """Queue a whole-buffer copy after `done` earlier ones (one semaphore counts them)."""
        hal = self._hal
        self._device.queue_copy(
            source, target, wait_semaphores=hal.HalFence.create_at(semaphore, done), signal_semaphores=hal.HalFence.create_at(semaphore, done + 1)
        )

    def _buffer(self, role: str, index: int, size: int):
        """A buffer for `role` ("in"/"out": host memory the device reaches, "dev": device memory) of `size`
        bytes (at least one), kept for the next call while the executable keeps at most `KEEP_BYTES`."""
        size = max(size, 1)
        key = (role, index)
        kept = self._kept.get(key)
        if kept is not None and kept.byte_length() == size:
            return kept
        memory, usage = (self._device_memory, self._device_usage) if role == "dev" else (self._memory, self._host_usage)
        buffer = self._allocator.allocate_buffer(memory_type=memory, allowed_usage=usage, allocation_size=size)
        if kept is not None:
            self._kept_bytes -= kept.byte_length()
            del self._kept[key]
        if self._kept_bytes + size <= KEEP_BYTES:
            self._kept[key] = buffer
            self._kept_bytes += size
        return buffer
