"""Device fingerprints: what about a device changes the native code built for it."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import field
from typing import Any, Mapping

from portkern.base.records import frozen_record, to_plain, wire


@frozen_record
class DeviceFingerprint:
    """A device as native code sees it. Equal fingerprints may share native code.

    `kind` is the device family ("cpu", "amdgpu", "cuda", "opencl"); `arch` the
    name the code generator targets (LLVM CPU name, gfx arch with its target
    features, sm version, OpenCL device name); `features` the code-changing
    feature flags; `properties` anything else that changes code or tuning
    (compute-unit count, wave size, driver version).
    """

    kind: str
    arch: str
    features: str = ""
    #: Sorted (name, value) pairs, written as a mapping.
    properties: tuple[tuple[str, str], ...] = field(default_factory=tuple, metadata=wire(encode=dict))

    @property
    def label(self) -> str:
        """Short human name, e.g. "cpu:znver5" or "amdgpu:gfx942"."""
        return f"{self.kind}:{self.arch}"

    def property(self, name: str, default: str = "") -> str:
        return dict(self.properties).get(name, default)

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeviceFingerprint":
        props = data.get("properties", {}) or {}
        return cls(
            str(data["kind"]),
            str(data["arch"]),
            str(data.get("features", "")),
            tuple(sorted((str(k), str(v)) for k, v in props.items())),
        )

    def digest(self) -> str:
        """A stable hash of everything in the fingerprint (hex)."""
        try:
            return _digest(self)
        except TypeError:  # an unhashable property value: not memoised
            return _digest.__wrapped__(self)

    def __str__(self) -> str:
        return self.label


@functools.lru_cache(maxsize=256)
def _digest(fingerprint: DeviceFingerprint) -> str:
    """`DeviceFingerprint.digest` (equal fingerprints have equal digests; every cache key holds one)."""
    canonical = json.dumps(fingerprint.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
