"""Framework tensors in GPU memory as arguments and results of GPU kernels, through DLPack, without copies.

A kernel on an NVIDIA or AMD GPU takes torch tensors that live on that GPU as they are: each
is imported into IREE as a buffer view over the tensor's own memory
(`HalDevice.from_dlpack_capsule`), and each result is copied on the GPU into a torch tensor
(IREE 3.13 cannot export the buffers its calls allocate). Nothing crosses to the host. Before the import, torch's current stream on the tensor's device is synchronised, so
the work that produces an argument has finished before IREE's own stream reads it; a call
returns once its results are written (IREE's synchronous entry functions) and copied, so
torch may use them at once.

Refused, as `ArgumentTypeError` with what to do: a GPU tensor of another framework (its
producer's stream cannot be synchronised here), one on another GPU than the kernel's (IREE
runs on the first), one that requires grad, one that is not contiguous (IREE reads buffers
densely), one that IREE cannot import, and a call that mixes GPU tensors with host arrays.
Element types and shapes are checked against the kernel's signature as a host array's are.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

from portkern.base.errors import ArgumentTypeError, brief
from portkern.jit.args import check_count, check_shape
from portkern.jit.tensors import DLPACK_CPU, dlpack_device, is_tensor, kind_name
from portkern.portable.bundle import Signature

#: DLPack device types (DLDeviceType) of GPU memory, by the IREE driver that runs kernels there.
DLPACK_DEVICE = {"cuda": 2, "hip": 10}

#: A signature's dtype names (`TensorSpec.dtype`) -> the IREE HalElementType names a tensor of it may import as.
_ELEMENT_TYPES = {
    "float16": ("FLOAT_16",), "float32": ("FLOAT_32",), "float64": ("FLOAT_64",), "bfloat16": ("BFLOAT_16",), "bool": ("BOOL_8",),
    **{f"int{n}": (f"SINT_{n}", f"INT_{n}") for n in (8, 16, 32, 64)},
    **{f"uint{n}": (f"UINT_{n}", f"INT_{n}") for n in (8, 16, 32, 64)},
}


def on_gpu(args: Sequence[object]) -> bool:
    """Whether any argument is a framework tensor whose memory is not host memory."""
    for arg in args:
        device = dlpack_device(arg) if is_tensor(arg) else None
        if device is not None and device[0] != DLPACK_CPU:
            return True
    return False


def import_arguments(kernel: str, signature: Signature, args: Sequence[object], driver: str, hal_device: Any, hal: Any) -> list:
    """The arguments as IREE buffer views over their own GPU memory, checked against the
    signature; an ArgumentTypeError/ArgumentShapeError naming the first that cannot be."""
    check_count(kernel, signature, args)
    expected = signature.inputs
    torch = sys.modules.get("torch")
    synchronised: set[object] = set()
    views = []
    for index, (arg, spec) in enumerate(zip(args, expected)):
        device = dlpack_device(arg) if is_tensor(arg) else None
        if device is None or device[0] == DLPACK_CPU:
            raise ArgumentTypeError(
                f"{kernel}() argument {index} is in host memory while others are on the GPU: pass every argument "
                f"on the kernel's GPU (e.g. torch.from_numpy(a).cuda()), or every one in host memory"
            )
        kind = kind_name(arg)
        if torch is None or not isinstance(arg, torch.Tensor):
            raise ArgumentTypeError(
                f"{kernel}() argument {index} is a {kind} in GPU memory; portkern takes torch's GPU tensors (or host memory)"
            )
        if device != (DLPACK_DEVICE.get(driver), 0):
            raise ArgumentTypeError(
                f"{kernel}() argument {index} is a {kind} on {arg.device}; the kernel runs on the first "
                f"{'NVIDIA' if driver == 'cuda' else 'AMD'} GPU ({'cuda' if driver == 'cuda' else 'hip'}:0): move it there"
            )
        if arg.requires_grad:
            raise ArgumentTypeError(f"{kernel}() argument {index} is a {kind} that requires grad; pass tensor.detach()")
        if not arg.is_contiguous():  # IREE reads a buffer densely, whatever strides DLPack gives
            raise ArgumentTypeError(f"{kernel}() argument {index} is a {kind} that is not contiguous; pass tensor.contiguous()")
        allowed = {int(getattr(hal.HalElementType, name)) for name in _ELEMENT_TYPES.get(spec.dtype, ())}
        if arg.device not in synchronised:  # the producer's work done before IREE's stream reads it
            torch.cuda.current_stream(arg.device).synchronize()
            synchronised.add(arg.device)
        try:
            view = hal_device.from_dlpack_capsule(arg.__dlpack__())
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            reason = brief(exc, None, sep=" ", limit=200) or type(exc).__name__
            raise ArgumentTypeError(
                f"{kernel}() argument {index}: a {kind} that IREE cannot import ({reason})"
            ) from None
        if int(view.element_type) not in allowed:
            raise ArgumentTypeError(f"{kernel}() argument {index} must have dtype {spec.dtype}, got {arg.dtype}")
        check_shape(kernel, index, spec, tuple(view.shape))
        views.append(view)
    if signature.contract is not None:
        signature.contract.bind(kernel, [tuple(v.shape) for v in views])
    return views


def export_results(views: Sequence[Any], signature: Signature, hal_device: Any, hal: Any) -> list:
    """The result buffer views as torch tensors on the same GPU: each copied, on the GPU, into a
    tensor torch allocated (IREE cannot hand out the memory of buffers its calls allocate)."""
    torch = sys.modules["torch"]  # the arguments were torch tensors
    tensors = []
    semaphore = hal_device.create_semaphore(0)
    copies = 0
    for view, spec in zip(views, signature.results):
        # (torch's stream was synchronised when the arguments were imported: nothing of it uses this memory)
        tensor = torch.empty(tuple(view.shape), dtype=getattr(torch, spec.dtype), device="cuda:0")
        source = view.get_buffer()
        if source.byte_length():
            target = hal_device.from_dlpack_capsule(tensor.__dlpack__()).get_buffer()
            hal_device.queue_copy(
                source,
                target,
                wait_semaphores=hal.HalFence.create_at(semaphore, copies),
                signal_semaphores=hal.HalFence.create_at(semaphore, copies + 1),
            )
            copies += 1
        tensors.append(tensor)
    if copies:
        hal.HalFence.create_at(semaphore, copies).wait()
    return tensors
