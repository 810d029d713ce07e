"""Prebuilt native code in a bundle: each MLIR kernel finalised for named targets, like a fat binary.

The loader serves a prebuilt slice only to a device whose fingerprint equals
the one recorded with it, and finalises the portable stage otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from portkern.jit.finalize import finalize
from portkern.jit.target import Target
from portkern.portable.bundle import Bundle, KernelRecord, NativeArtifact, sha256

#: Called before each kernel is finalised for each target.
Progress = Callable[[KernelRecord, Target], None]
FINALIZED_KINDS = ("mlir", "onnx")


def prebuild(bundle: Bundle, targets: Sequence[Target], progress: Progress | None = None) -> Bundle:
    """`bundle` with native code for every target added to each MLIR/ONNX kernel
    (replacing a slice already there for the same target)."""
    blobs = dict(bundle.blobs)
    records = []
    for record in bundle.kernels:
        if record.kind not in FINALIZED_KINDS:
            records.append(record)
            continue
        native = {n.target: n for n in record.native}
        for target in targets:
            if progress:
                progress(record, target)
            data = finalize(bundle, record, target)
            blobs[sha256(data)] = data
            native[target.label] = NativeArtifact(target.label, "vmfb", sha256(data), len(data), target.fingerprint.to_dict())
        records.append(dataclasses.replace(record, native=tuple(native[label] for label in sorted(native))))
    referenced = {item.blob for r in records for item in (*r.stages, *r.native)}
    return Bundle(bundle.name, tuple(records), {sha: data for sha, data in blobs.items() if sha in referenced}, version=bundle.version)
