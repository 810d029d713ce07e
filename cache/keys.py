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
with the same dispatch on the same device share one tuning result.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Sequence

from portkern.cache.device import DeviceFingerprint

KEY_VERSION = 1


def _hash(parts: dict[str, Any]) -> str:
    canonical = json.dumps({"v": KEY_VERSION, **parts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def kernel_digest(kind: str, entry: str, stage_blob: str) -> str:
    """Content digest of a kernel: what it computes, independent of bundle and name."""
    return _hash({"kind": kind, "entry": entry, "stage": stage_blob})


@dataclass(frozen=True)
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


def problem_key(description: str, runtime: str) -> str:
    """The problem key of a dispatch: what it computes (op kinds, indexing maps, shapes,
    dtypes) and how it is run (runtime driver and thread count change the best tiles)."""
    return f"{runtime} | {description}"


def tuning_key(problem: str, device: DeviceFingerprint, compiler: str) -> str:
    """Key of the best perf config found for a problem on a device."""
    return _hash({"problem": problem, "device": device.digest(), "compiler": compiler})


def validated_key(payload_digest: str, schema_digest: str) -> str:
    """Key of the memo "a payload with this digest passed this schema"."""
    return _hash({"validated": payload_digest, "schema": schema_digest})


def parameters_key(path: str, device: int, inode: int, size: int, mtime_ns: int, ctime_ns: int, root: str) -> str:
    """Key of the memo "these parameter chunks of this file were checked": the file's identity
    (any change to the file changes its size, mtime or ctime) and the section's root digest."""
    return _hash({"parameters": root, "file": [path, device, inode, size, mtime_ns, ctime_ns]})
