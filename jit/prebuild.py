"""Prebuilt native code in a bundle: each MLIR kernel finalised for named targets, like a fat binary.

The loader serves a prebuilt slice to a device whose fingerprint equals the
one recorded with it (a CPU slice also to a host CPU with all its features),
and finalises the portable stage otherwise. Every slice is compiled by a job
of the native-code service (`jit.native.compile_job`) in the bounded worker
pool, under the same bounds as any other compile. A kernel that fails for a
target is reported and left without that slice; the others are still built.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Sequence

from portkern.base.errors import DeviceError, PortkernError, one_line
from portkern.base.records import frozen_record
from portkern.jit.native import DEFAULT_CONFIG, compile_job, stage_source
from portkern.jit.target import Target
from portkern.jit.toolchain import IREE
from portkern.portable.bundle import IREE_KINDS, Bundle, KernelRecord, NativeArtifact, sha256

if TYPE_CHECKING:
    from portkern.jit.workers import Job, Pool

#: Called for each kernel and target as its compile is handed to a worker (largest kernels first),
#: or after the others for one found impossible.
Progress = Callable[[KernelRecord, Target], None]
FINALIZED_KINDS = IREE_KINDS


@frozen_record
class Failure:
    """A kernel that could not be finalised for a target, and why."""

    kernel: str
    target: str
    error: str


@frozen_record
class Prebuilt:
    """The bundle with the native code that could be built, and what could not."""

    bundle: Bundle
    failures: tuple[Failure, ...]


def prebuild(bundle: Bundle, targets: Sequence[Target], progress: Progress | None = None, pool: Pool | None = None) -> Prebuilt:
    """`bundle` with native code for every target added to each MLIR/ONNX kernel
    (replacing a slice already there for the same target), past any that fail; compiled
    concurrently by the workers of `pool` (the process's shared pool by default)."""
    from portkern.jit.workers import shared_pool

    pairs = [(record, target) for record in bundle.kernels if record.kind in FINALIZED_KINDS for target in targets]
    jobs: dict[int, Job] = {}
    errors: dict[int, PortkernError] = {}
    for index, (record, target) in enumerate(pairs):
        try:
            jobs[index] = _job(index, bundle, record, target)
        except PortkernError as exc:
            errors[index] = exc
    announced: set[int] = set()

    def announce(index: int) -> None:
        if progress is not None and index not in announced:
            announced.add(index)
            progress(*pairs[index])

    results = (pool or shared_pool()).run(jobs.values(), on_start=lambda job, pid: announce(job.id))
    for index in range(len(pairs)):
        announce(index)
    blobs = dict(bundle.blobs)
    slices = {record.name: {n.target: n for n in record.native} for record, _ in pairs}  # names are unique in a bundle
    failures = []
    for index, (record, target) in enumerate(pairs):
        result = results.get(index)
        if result is not None and not result.ok:
            errors[index] = result.error_for(record.name, target)
        if index in errors:
            why = f"{type(errors[index]).__name__}: {one_line(errors[index])}"
            failures.append(Failure(record.name, target.label, why))
            continue
        data = results[index].data["native"]
        blobs[sha256(data)] = data
        slices[record.name][target.label] = NativeArtifact(target.label, "vmfb", sha256(data), len(data), target.fingerprint.to_dict())
    records = [
        dataclasses.replace(record, native=tuple(slices[record.name][label] for label in sorted(slices[record.name])))
        if record.name in slices else record
        for record in bundle.kernels
    ]
    referenced = {s.blob for r in records for s in r.stages} | {n.blob for r in records for n in r.native}
    kept = {sha: data for sha, data in blobs.items() if sha in referenced}
    return Prebuilt(dataclasses.replace(bundle, kernels=tuple(records), blobs=kept), tuple(failures))  # parameters kept


def _job(index: int, bundle: Bundle, record: KernelRecord, target: Target) -> Job:
    """The job that compiles a kernel's stage for `target` with the compiler's default config."""
    if not IREE.accepts(target):
        raise DeviceError(f"{target.label} runs OpenCL kernels; {record.kind} kernels are prebuilt for IREE targets")
    stage, _ = IREE.stage(bundle, record, target, DEFAULT_CONFIG)
    IREE.check(stage, record.name)
    return compile_job(index, record.name, target, stage_source(bundle, stage))
