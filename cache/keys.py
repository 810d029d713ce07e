"""Cache keys. Every part that can change native code or a tuning result is in here.

An artifact key hashes, as canonical JSON:

- the kernel's content digest (its stage blob, entry point and kind), so equal
  kernels share entries whatever bundle carries them and any change misses;
- the device fingerprint digest (kind, arch, features, code-changing properties);
- the compiler and runtime versions with their source revisions;
- the perf config string ("default" for the compiler's own choice);
- the compile flags that change code (target flags included).

A tuning key hashes the problem key (what the dispatch computes: op kinds,
shapes, dtypes), the device fingerprint and the compiler version: two bundles
with the same dispatch on the same device share one tuning result. The problem
keys themselves (a dispatch's, a kernel's selection, its bucket index, an OpenCL
kernel's point space) and the probe key are formed here too: no other module
writes a key. A kernel's selection is keyed by its content digest and, for a
kernel with a launch description (OpenCL C), by that description and every
stage it was built into (`opencl_space`): bundles built from one `.cl` source with
different parameter spaces (or none) keep separate selections.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import TYPE_CHECKING, Any, Sequence

from portkern.base.records import frozen_record
from portkern.cache.device import DeviceFingerprint

if TYPE_CHECKING:
    from portkern.base.signing import Verified

KEY_VERSION = 1


def _hash(parts: dict[str, Any]) -> str:
    canonical = json.dumps({"v": KEY_VERSION, **parts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@functools.lru_cache(maxsize=4096)
def kernel_digest(kind: str, entry: str, stage_blob: str) -> str:
    """Content digest of a kernel: what it computes, independent of bundle and name."""
    return _hash({"kind": kind, "entry": entry, "stage": stage_blob})


@frozen_record
class ArtifactKey:
    """The parts of an artifact key, kept for display; `.hex` is the key itself."""

    kernel: str
    device: DeviceFingerprint
    compiler: str
    config: str
    flags: tuple[str, ...]

    @property
    def hex(self) -> str:
        return _hash(
            {
                "kernel": self.kernel,
                "device": self.device.digest(),
                "compiler": self.compiler,
                "config": self.config,
                "flags": list(self.flags),
            }
        )


def artifact_key(
    kernel: str, device: DeviceFingerprint, compiler: str, config: str = "default", flags: Sequence[str] = ()
) -> ArtifactKey:
    """Key of the native code for `kernel` (a `kernel_digest`) on `device`."""
    return ArtifactKey(kernel, device, compiler, config, tuple(flags))


def dispatch_problem(description: str, driver: str, threads: int) -> str:
    """The problem key of a dispatch: what it computes (`description`: op kinds, indexing maps,
    shapes, dtypes) and how it is run (the runtime driver and thread count change the best tiles)."""
    return f"driver={driver} threads={threads} | {description}"


def selection_problem(kernel: str, space: str | None = None) -> str:
    """The problem "which config for this whole kernel" (`kernel`: its `kernel_digest`;
    `space`: the `opencl_space` of a kernel with a launch description, else None); its
    record is the kernel's stored selection."""
    return f"kernel:{kernel}" if space is None else f"kernel:{kernel} space:{space}"


def index_problem(selection: str) -> str:
    """The problem under which a kernel's per-bucket decisions are stored (`selection`: its
    `selection_problem`)."""
    return selection + " buckets"


def opencl_space(launch: Any, stage_blobs: Sequence[str]) -> str:
    """Digest of an OpenCL kernel as built: its launch description (`launch`: the record's,
    as JSON data: arguments, sizes, parameter space and its points) and every stage."""
    return hashlib.sha256(json.dumps([launch, list(stage_blobs)], sort_keys=True).encode()).hexdigest()


def opencl_problem(kind: str, entry: str, launch: Any, stage_blobs: Sequence[str], points: int, at: str) -> str:
    """The problem key of an OpenCL kernel's parameter space: the kernel with its launch
    description (`launch`: the record's, as JSON data) and stages, the number of valid points,
    and the shapes it is tuned at (`at`, "" for static shapes)."""
    built = opencl_space(launch, stage_blobs)
    return f"opencl:{kernel_digest(kind, entry, built)} points={points} at {at or 'static shapes'}"


def tuning_key(problem: str, device: DeviceFingerprint, compiler: str) -> str:
    """Key of the best perf config found for a problem on a device."""
    return _hash({"problem": problem, "device": device.digest(), "compiler": compiler})


def probe_key(parts: Sequence[str], compiler_version: str, compiler_revision: str) -> str:
    """Key of a probe record: what was probed (`parts`) and the compiler that answered."""
    return hashlib.sha256("|".join((*parts, compiler_version, compiler_revision)).encode()).hexdigest()


def validated_key(payload_digest: str, schema_digest: str) -> str:
    """Key of the memo "a payload with this digest passed this schema"."""
    return _hash({"validated": payload_digest, "schema": schema_digest})


def signature_key(check: Verified) -> str:
    """Key of the memo "this signature over these bytes passed model-signing's verifier with
    this trusted key, under this trusted key set" (`signing.Verified`)."""
    return _hash({"signature": check.signature, "content": check.content, "name": check.name,
                  "key": check.key, "trusted": check.trusted})


def parameters_key(path: str, device: int, inode: int, size: int, mtime_ns: int, ctime_ns: int, root: str) -> str:
    """Key of the memo "these parameter chunks of this file were checked": the file's identity
    (any change to the file changes its size, mtime or ctime) and the section's root digest."""
    return _hash({"parameters": root, "file": [path, device, inode, size, mtime_ns, ctime_ns]})
