"""What `portkern.load` checks beyond a bundle file's own rules, shared with the builder's self-check.

Each OpenCL kernel's launch description must be sound, and each MLIR stage's
producer an IREE of the installed release unless the kernel has a source stage. The builder runs these, and the
whole reader, on the bytes it is about to publish.
"""

from __future__ import annotations

from portkern.portable.bundle import Bundle, decode
from portkern.portable.producer import check_release


def check_kernels(bundle: Bundle) -> None:
    """Raise the typed error `portkern.load` would raise for any kernel of `bundle`."""
    for record in bundle.kernels:
        if any(stage.format == "spirv" for stage in record.stages):
            from portkern.portable.launch import launch_of  # OpenCL kernels only

            launch_of(record)
        for stage in record.stages:
            if stage.format == "mlir-bytecode" and record.source_stage() is None:
                check_release(stage.producer, record.name)  # with a source stage, another release compiles that


def read_back(data: bytes, file_size: int | None = None) -> Bundle:
    """Bundle bytes read exactly as `portkern.load` reads a file (every rule of docs/bundle-format.md):
    a whole file, or its header and payload and the size of the file they start
    (the parameter section's layout is checked; its digests were made as it was written)."""
    bundle = decode(data, file_size=file_size)
    check_kernels(bundle)
    return bundle
