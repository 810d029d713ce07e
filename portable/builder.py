"""`portkern build`: a manifest's kernels, lowered once, in one bundle."""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

from portkern.base.errors import BuildError, PortkernError
from portkern.base.framing import file_sha256
from portkern.portable.bundle import IREE_KINDS, Bundle, KernelRecord, Stage, sha256, write_bundle
from portkern.portable.compiler import Compiler, bytecode
from portkern.portable.contract_ir import build_contract
from portkern.portable.family import FAMILIES, FAMILY_PHASE, lower_family_stage
from portkern.portable.lower import BUILD_FLAGS, PORTABLE_PHASE, Lowered, lower_source
from portkern.portable.manifest import KernelSpec, Manifest, load_manifest
from portkern.portable.parameters import ParameterData
from portkern.portable.source import source_stage
from portkern.portable.verify import read_back

#: Called before each kernel is built, with its spec, index and the kernel count.
Progress = Callable[[KernelSpec, int, int], None]
#: Applied to the built bundle before it is written (e.g. to add prebuilt native code).
Finish = Callable[[Bundle], Bundle]


def build(manifest: Manifest, progress: Progress | None = None, workdir: Path | None = None, source: bool = True) -> Bundle:
    """Lower every kernel of a manifest and gather them in a bundle (not yet written; the
    parameters of PyTorch programs wait in `workdir` until it is); `source`: kernels compiled
    by IREE also keep their source stage (`portable.source`)."""
    compiler = Compiler(BUILD_FLAGS)
    records: list[KernelRecord] = []
    blobs: dict[str, bytes] = {}
    parameters: list[ParameterData] = []
    for index, spec in enumerate(manifest.kernels):
        if progress:
            progress(spec, index, len(manifest.kernels))
        record, kernel_blobs, kernel_parameters = build_kernel(spec, compiler, manifest.targets, workdir, source)
        records.append(record)
        blobs.update(kernel_blobs)
        parameters.extend(kernel_parameters)
    return Bundle(manifest.bundle, tuple(records), blobs, parameter_data=tuple(parameters))


def build_kernel(
    spec: KernelSpec, compiler: Compiler, targets: tuple[str, ...] = ("cpu",), workdir: Path | None = None, source: bool = True
) -> tuple[KernelRecord, dict[str, bytes], tuple[ParameterData, ...]]:
    """One kernel's bundle record, the blobs it refers to and its parameters (to be written;
    the record's own `parameters` are placed when the bundle is written).

    `targets` are the manifest's device families: each GPU family among them
    adds a stage lowered for that family's placeholder target. With `source`,
    a kernel compiled by IREE also keeps its source stage, for other IREE releases.
    """
    with open(spec.source, "rb") as f:  # streamed: a model's inline weights are never held whole
        source_sha = file_sha256(f)
    if spec.kind in IREE_KINDS:
        lowered = lower_source(spec, compiler, workdir)
        blob = sha256(lowered.stage_bytes)
        stages = [Stage(PORTABLE_PHASE, "any", "mlir-bytecode", blob, len(lowered.stage_bytes), lowered.producer)]
        blobs = {blob: lowered.stage_bytes}
        for name in targets:
            if name in FAMILIES:
                stage, data = family_stage(spec, lowered, name, compiler)
                if stage is not None:
                    stages.append(stage)
                    blobs[stage.blob] = data
        if source:
            stage, data = source_stage(spec, lowered)
            stages.append(stage)
            blobs[stage.blob] = data
        contract = build_contract(spec, compiler, lowered.source, lowered.entry, lowered.signature)
        signature = replace(lowered.signature, contract=contract)
        record = KernelRecord(spec.name, spec.kind, lowered.entry, signature, tuple(stages), source_sha)
        return record, blobs, lowered.parameters
    if spec.kind in ("opencl", "spirv"):
        from portkern.portable.opencl import build_opencl

        return (*build_opencl(spec, source_sha), ())
    raise BuildError(f"{spec.source}: kernels of kind {spec.kind!r} are not supported by this build")


def family_stage(spec: KernelSpec, lowered: Lowered, name: str, compiler: Compiler) -> tuple[Stage | None, bytes]:
    """The kernel's stage for a GPU family, or None when only the flow stage is portable."""
    fam = FAMILIES[name]
    module = lower_family_stage(compiler, lowered.stage_bytes, fam, spec.name)
    if module is None:
        return None, b""
    data = bytecode(module)
    stage = Stage(FAMILY_PHASE, fam.name, "mlir-bytecode", sha256(data), len(data), lowered.producer, fam.placeholder)
    return stage, data


def self_check(data: bytes, output: str | Path, file_size: int | None = None, needed: Iterable[tuple[str, str, str]] = ()) -> None:
    """Read a bundle's bytes back exactly as `portkern.load` will, before they are published
    (`data`: header and payload; `file_size`: with the parameter section, if there is one), and
    check that it holds every parameter its kernels were built to need (`needed`: kernel, scope, name)."""
    try:
        back = read_back(data, file_size)
    except PortkernError as exc:
        raise BuildError(f"{output}: not written: the bundle as built fails the reader ({type(exc).__name__}: {exc})") from None
    held = {(record.name, p.scope, p.name) for record in back.kernels for p in record.parameters}
    missing = sorted(set(needed) - held)
    if missing:
        kernel, scope, name = missing[0]
        raise BuildError(
            f"{output}: not written: kernel {kernel!r} needs {len(missing)} parameter(s) the bundle lacks "
            f"(first: {scope}::{name}); every call of it would fail"
        )


def build_file(
    manifest_path: str | Path, output: str | Path, progress: Progress | None = None, finish: Finish | None = None, source: bool = True
) -> Bundle:
    """Build the bundle a manifest describes and write it to `output` (`source`: see `build`)."""
    with tempfile.TemporaryDirectory(prefix=f"portkern-build-{os.getpid()}-") as workdir:
        bundle = build(load_manifest(manifest_path), progress, Path(workdir), source)
        needed = [(p.kernel, p.scope, p.name) for p in bundle.parameter_data]
        if finish is not None:
            bundle = finish(bundle)
        digest = write_bundle(bundle, output, check=lambda data, size: self_check(data, output, size, needed))
    return replace(bundle, digest=digest, version=bundle.written_version(), parameter_data=())
