"""Prebuilt native code in a bundle: each MLIR kernel finalised for named targets, like a fat binary.

The loader serves a prebuilt slice to a device whose fingerprint equals the
one recorded with it (a CPU slice also to a host CPU with all its features),
and finalises the portable stage otherwise. A kernel
that fails for a target is reported and left without that slice; the others
are still built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

from portkern.base.errors import DeviceError, PortkernError, brief
from portkern.jit.finalize import finalize
from portkern.jit.target import Target
from portkern.jit.toolchain import IREE
from portkern.portable.bundle import IREE_KINDS, Bundle, KernelRecord, NativeArtifact, sha256

#: Called before each kernel is finalised for each target.
Progress = Callable[[KernelRecord, Target], None]
FINALIZED_KINDS = IREE_KINDS


@dataclass(frozen=True)
class Failure:
    """A kernel that could not be finalised for a target, and why."""

    kernel: str
    target: str
    error: str


@dataclass(frozen=True)
class Prebuilt:
    """The bundle with the native code that could be built, and what could not."""

    bundle: Bundle
    failures: tuple[Failure, ...]


def prebuild(bundle: Bundle, targets: Sequence[Target], progress: Progress | None = None) -> Prebuilt:
    """`bundle` with native code for every target added to each MLIR/ONNX kernel
    (replacing a slice already there for the same target), past any that fail."""
    blobs = dict(bundle.blobs)
    records, failures = [], []
    for record in bundle.kernels:
        if record.kind not in FINALIZED_KINDS:
            records.append(record)
            continue
        native = {n.target: n for n in record.native}
        for target in targets:
            if progress:
                progress(record, target)
            try:
                if not IREE.accepts(target):
                    raise DeviceError(f"{target.label} runs OpenCL kernels; {record.kind} kernels are prebuilt for IREE targets")
                data = finalize(bundle, record, target)
            except PortkernError as exc:
                failures.append(Failure(record.name, target.label, f"{type(exc).__name__}: {brief(exc, lines=None, sep=' ', limit=None)}"))
                continue
            blobs[sha256(data)] = data
            native[target.label] = NativeArtifact(target.label, "vmfb", sha256(data), len(data), target.fingerprint.to_dict())
        records.append(dataclasses.replace(record, native=tuple(native[label] for label in sorted(native))))
    referenced = {item.blob for r in records for item in (*r.stages, *r.native)}
    kept = {sha: data for sha, data in blobs.items() if sha in referenced}
    return Prebuilt(dataclasses.replace(bundle, kernels=tuple(records), blobs=kept), tuple(failures))  # parameters kept
