"""`portkern build`: a manifest's kernels, lowered once, in one bundle."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from portkern.errors import BuildError
from portkern.portable.bundle import Bundle, KernelRecord, Stage, sha256, write_bundle
from portkern.portable.compiler import Compiler
from portkern.portable.lower import PORTABLE_PHASE, lower_source
from portkern.portable.manifest import KernelSpec, Manifest, load_manifest

#: Called before each kernel is built, with its spec, index and the kernel count.
Progress = Callable[[KernelSpec, int, int], None]


def build(manifest: Manifest, progress: Progress | None = None) -> Bundle:
    """Lower every kernel of a manifest and gather them in a bundle (not yet written)."""
    compiler = Compiler()
    records: list[KernelRecord] = []
    blobs: dict[str, bytes] = {}
    for index, spec in enumerate(manifest.kernels):
        if progress:
            progress(spec, index, len(manifest.kernels))
        record, kernel_blobs = build_kernel(spec, compiler)
        records.append(record)
        blobs.update(kernel_blobs)
    return Bundle(manifest.bundle, tuple(records), blobs)


def build_kernel(spec: KernelSpec, compiler: Compiler) -> tuple[KernelRecord, dict[str, bytes]]:
    """One kernel's bundle record and the blobs it refers to."""
    source_sha = hashlib.sha256(spec.source.read_bytes()).hexdigest()
    if spec.kind in ("mlir", "onnx"):
        lowered = lower_source(spec, compiler)
        blob = sha256(lowered.stage_bytes)
        stage = Stage(PORTABLE_PHASE, "any", "mlir-bytecode", blob, len(lowered.stage_bytes), lowered.producer)
        record = KernelRecord(spec.name, spec.kind, lowered.entry, lowered.signature, (stage,), source_sha)
        return record, {blob: lowered.stage_bytes}
    if spec.kind in ("opencl", "spirv"):
        from portkern.portable.opencl import build_opencl

        return build_opencl(spec, source_sha)
    raise BuildError(f"{spec.source}: kernels of kind {spec.kind!r} are not supported by this build")


def build_file(manifest_path: str | Path, output: str | Path, progress: Progress | None = None) -> Bundle:
    """Build the bundle a manifest describes and write it to `output`."""
    bundle = build(load_manifest(manifest_path), progress)
    digest = write_bundle(bundle, output)
    return Bundle(bundle.name, bundle.kernels, bundle.blobs, digest, bundle.version)
