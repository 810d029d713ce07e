"""`portkern.load(path).kernel(name, device=...)`: cached native code, callable on NumPy arrays."""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from portkern import schemas, signing
from portkern.cache.device import DeviceFingerprint
from portkern.cache.keys import ArtifactKey, artifact_key, kernel_digest, validated_key
from portkern.cache.store import UNUSABLE, CacheWarning, Entry, Filter, Store, default_store
from portkern.errors import DeviceError, FinalizeError, KernelRuntimeError, PerfConfigError, TuningError
from portkern.jit import buckets, cpu, devices
from portkern.jit.args import check_arguments
from portkern.jit.codeobject import problem as code_problem
from portkern.jit.target import Target
from portkern.portable.bundle import Bundle, KernelRecord, Signature, Stage, decode_file, read_bundle_bytes
from portkern.portable.launch import launch_of
from portkern.jit.toolchain import OPENCL, toolchain_for
from portkern.portable.producer import check_release

if TYPE_CHECKING:
    from portkern.tuner.results import TuneResult

DEFAULT_CONFIG = "default"
#: `tune=` values that never search.
NO_SEARCH = (None, "none", "default")


@dataclass(frozen=True)
class Native:
    """Native code for one kernel on one target, and where it came from."""

    data: bytes
    key: str
    config: str
    #: "cache", "remote" (the fleet's remote tier), "prebuilt", "finalized", or "tuned" (searched for in this call).
    origin: str
    finalize_s: float = 0.0
    #: The device the code was built for (a named CPU's label when it serves this host's CPU).
    built_for: str = ""


def load(path: str | Path, *, store: Store | None = None) -> "LoadedBundle":
    """Open and check a bundle; nothing is compiled until a kernel is asked for."""
    store = store if store is not None else default_store()
    schema = schemas.digest("bundle")
    seen: list[bool] = []

    def validated(digest: str) -> bool:
        seen.append(store.get_record("v", validated_key(digest, schema)) is not None)
        return seen[-1]

    data = read_bundle_bytes(path)
    bundle = decode_file(path, data, validated)
    check_signature(bundle, Path(path), data)
    for record in bundle.kernels:
        if toolchain_for(record) is OPENCL:
            launch_of(record)
        for stage in record.stages:
            if stage.format == "mlir-bytecode":
                check_release(stage.producer, record.name)
    if not any(seen):
        store.put_record("v", validated_key(bundle.digest, schema), {"bundle": bundle.name})
    return LoadedBundle(bundle, Path(path), store)


def check_signature(bundle: Bundle, path: Path, data: bytes) -> None:
    """Under `PORTKERN_REQUIRE_SIGNATURE`, refuse a bundle that carries prebuilt native code
    unless `data` (its bytes as read) is signed by a trusted key."""
    policy = signing.from_env()
    if policy.required and any(record.native for record in bundle.kernels):
        verdict = signing.verify_file(path, data, policy.trusted)
        signing.require_trusted(verdict, f"{path}: refused (it carries prebuilt native code and {signing.REQUIRE_ENV}=1)")


def check_toolchain(record: KernelRecord, target: Target) -> None:
    """Refuse an OpenCL kernel on an IREE device and an IREE kernel on an OpenCL device."""
    if not toolchain_for(record).accepts(target):
        wanted = "an OpenCL device (device='opencl')" if toolchain_for(record) is OPENCL else "an IREE device such as 'cpu'"
        raise DeviceError(f"{record.name!r} ({record.kind} kernel) runs on {wanted}, not on {target.label}")


def compiler_id(record: KernelRecord) -> str:
    """The toolchain that turns this kernel into native code (part of every cache key)."""
    return toolchain_for(record).compiler_id()


def selection_problem(record: KernelRecord, target: Target) -> str:
    """The tuning problem "which config for this whole kernel" (the tuner stores its answer)."""
    stage = record.stage(target.family)
    return f"kernel:{kernel_digest(record.kind, record.entry, stage.blob)}"


class LoadedBundle:
    """A bundle opened on this machine."""

    def __init__(self, bundle: Bundle, path: Path, store: Store | None = None) -> None:
        self.bundle = bundle
        self.path = path
        self.store = store if store is not None else default_store()

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def digest(self) -> str:
        return self.bundle.digest

    def names(self) -> list[str]:
        return [k.name for k in self.bundle.kernels]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def record(self, name: str) -> KernelRecord:
        return self.bundle.kernel(name)

    def kernel(self, name: str, device: str = "cpu", tune: str | None = None, shapes: Sequence | None = None) -> "Kernel":
        """A callable kernel for a device on this machine.

        `tune=None` never searches: it uses the config stored for this device
        by an earlier tuning run, else the compiler's default. `tune="quick"`,
        `"full"`, ... tune now (unless a result is stored) and store the winner.
        For a kernel with dynamic dimensions, `shapes=[...]` (one entry per
        shape: a shape per argument, or {argument name: shape}) tunes now for
        those shapes' buckets; calls in a tuned bucket run its code, others the
        dynamic default.
        """
        record = self.record(name)
        target = devices.resolve(device, self.store)
        if not target.runnable:
            raise DeviceError(
                f"cannot run {name!r} on {target.label} here: {target.reason} "
                f"(use `portkern finalize --target {target.label}` to build for it ahead of time)"
            )
        check_toolchain(record, target)
        if not toolchain_for(record).tunable and tune not in NO_SEARCH:
            raise TuningError(f"{name!r} ({record.kind} kernel) runs with its manifest's launch sizes; it is not tuned")
        buckets = None
        if shapes is not None:
            if tune in NO_SEARCH:
                raise TuningError(f"shapes= says what to tune {name!r} for; it needs a tuning strategy (tune='quick', ...)")
            from portkern.tuner.session import tune_kernel_shapes

            buckets = tune_kernel_shapes(self, record, target, tune, shapes)
        config, tuning = self.config_for(record, target, tune)
        try:
            native = self.native(record, target, config)
        except (FinalizeError, PerfConfigError) as exc:
            if config == DEFAULT_CONFIG:
                raise
            self._set_aside(record, target, config, exc)
            config, tuning = DEFAULT_CONFIG, None
            native = self.native(record, target, config)
        if tuning is not None and tuning.source == "search":
            native = replace(native, origin="tuned")
        try:
            executable = self._executable(record, target, native)
        except KernelRuntimeError as exc:
            if native.origin not in ("cache", "remote"):
                raise
            warnings.warn(f"cached native code for {name!r} on {target.label} does not load ({exc}); rebuilding it", CacheWarning, stacklevel=2)
            self.store.delete(native.key)
            if native.origin == "remote":
                self.store.remote.reject_native(native.key, f"does not load: {exc}")
            native = self.native(record, target, config)
            executable = self._executable(record, target, native)
        return Kernel(record, target, native, executable, tuning, self._bucket_table(record, target), buckets)

    def _bucket_table(self, record: KernelRecord, target: Target) -> dict:
        """The tuned buckets' code of a kernel with dynamic dimensions (empty when none is tuned)."""
        contract = record.signature.contract
        if contract is None or not contract.symbols or not toolchain_for(record).tunable:
            return {}
        problem = buckets.index_problem(selection_problem(record, target))
        return buckets.load_table(self, record, target, self.store.get_tuning(problem, target.fingerprint, compiler_id(record)))

    def config_for(self, record: KernelRecord, target: Target, tune: str | None) -> tuple[str, "TuneResult | None"]:
        """The perf config to use (stored selection, default, or a fresh tuning result),
        and the tuning result when `tune` asked for one."""
        if tune in NO_SEARCH:
            if tune is None:
                chosen = self.store.get_tuning(selection_problem(record, target), target.fingerprint, compiler_id(record))
                if chosen and isinstance(chosen.get("config"), str) and not chosen.get(UNUSABLE):
                    return chosen["config"], None
            return DEFAULT_CONFIG, None
        from portkern.tuner.session import tune_kernel

        result = tune_kernel(self, record, target, strategy=tune)
        return result.config, result

    def _set_aside(self, record: KernelRecord, target: Target, config: str, error: Exception) -> None:
        """Warn that a stored config does not build, and mark its record so it is not used again."""
        reason = " ".join(str(error).split())[:300]
        warnings.warn(
            f"stored tuning config {config[:80]!r} of {record.name!r} on {target.label} does not build ({reason}); "
            "using the compiler's default and marking the stored result unusable",
            CacheWarning,
            stacklevel=3,
        )
        problem, compiler = selection_problem(record, target), compiler_id(record)
        stored = self.store.get_tuning(problem, target.fingerprint, compiler)
        if stored is not None and stored.get("config") == config:
            self.store.put_tuning(problem, target.fingerprint, compiler, {**stored, UNUSABLE: reason})

    def key(self, record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> ArtifactKey:
        stage, identity = self._stage(record, target)
        return artifact_key(
            kernel_digest(record.kind, record.entry, stage.blob),
            target.fingerprint,
            compiler_id(record),
            config,
            identity,
        )

    def _stage(self, record: KernelRecord, target: Target) -> tuple[Stage, tuple[str, ...]]:
        """The stage finalised for a target, and what besides it selects the native code."""
        check_toolchain(record, target)
        return toolchain_for(record).stage(self.bundle, record, target)

    def native(self, record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> Native:
        """Native code from the cache, the remote tier, the bundle's prebuilt slices, or a fresh
        finalisation (under a lock per key on this host and, with a remote tier, fleet-wide)."""
        key = self.key(record, target, config).hex
        hit = self._cached(key, target)
        if hit is not None:
            return Native(hit[0], key, config, "cache", hit[1].finalize_s, target.label)
        remote = self.store.remote
        with self.store.lock(key):
            hit = self._cached(key, target, count=False)
            if hit is not None:
                return Native(hit[0], key, config, "cache", hit[1].finalize_s, target.label)
            shared = self._from_remote(record, target, key, config, count=True)
            if shared is not None:
                return shared
            with remote.lock(key) if remote is not None else nullcontext(False) as fleet_wide:
                shared = self._from_remote(record, target, key, config) if fleet_wide else None
                if shared is not None:
                    return shared
                prebuilt = self._prebuilt(record, target) if config == DEFAULT_CONFIG else None
                if prebuilt is None:
                    named = self._named_cpu(record, target, config)
                    if named is not None:
                        return named
                start = time.perf_counter()
                data = prebuilt if prebuilt is not None else self._compile(record, target, config)
                elapsed = time.perf_counter() - start
                native = Native(data, key, config, "prebuilt" if prebuilt is not None else "finalized", elapsed, target.label)
                self.store.put(key, data, self._entry(record, target, native))
                if prebuilt is None:
                    self._publish(record, target, native)
                return native

    def _from_remote(self, record: KernelRecord, target: Target, key: str, config: str, count: bool = False) -> Native | None:
        """Native code from the remote tier, checked for this device and copied into the local cache."""
        remote = self.store.remote
        fetched = remote.get_native(key) if remote is not None else None
        if fetched is not None:
            problem = code_problem(fetched.data, target.fingerprint)
            if problem is not None:
                remote.reject_native(key, f"not code for {target.label}: {problem}")
                fetched = None
        if remote is not None and count:
            self.store.count_remote(fetched is not None)
        if fetched is None:
            return None
        finalize_s = fetched.meta.get("finalize_s", 0.0)
        native = Native(fetched.data, key, config, "remote", finalize_s, target.label)
        self.store.put(key, fetched.data, self._entry(record, target, native))
        return native

    def _publish(self, record: KernelRecord, target: Target, native: Native) -> None:
        """Share native code built here through the remote tier, if there is one."""
        if self.store.remote is not None:
            meta = {"config": native.config, "format": toolchain_for(record).format, "finalize_s": native.finalize_s}
            self.store.remote.put_native(native.key, native.data, meta)

    def put_native(
        self, record: KernelRecord, target: Target, config: str, data: bytes, finalize_s: float = 0.0, kernel_time_s: float | None = None
    ) -> Native:
        """Cache native code built elsewhere (the tuner's winning candidate) for `config`,
        with the kernel time the tuner measured for it."""
        key = self.key(record, target, config).hex
        native = Native(data, key, config, "finalized", finalize_s)
        entry = self._entry(record, target, native)
        entry.kernel_time_s = kernel_time_s
        self.store.put(key, data, entry)
        self._publish(record, target, native)
        return native

    def _cached(self, key: str, target: Target, count: bool = True):
        """A cache entry, unless it is GPU code for another arch (then it is evicted)."""
        hit = self.store.get(key, count=count)
        problem = code_problem(hit[0], target.fingerprint) if hit is not None else None
        if problem is not None:
            warnings.warn(f"cache entry {key[:16]} is not code for {target.label} ({problem}); evicted", CacheWarning)
            self.store.delete(key)
            return None
        return hit

    def _named_cpu(self, record: KernelRecord, target: Target, config: str) -> Native | None:
        """Code built for a named CPU whose every feature this host has, from the cache or the
        bundle's prebuilt slices, most specific CPU first; only for this host's own CPU."""
        if target.fingerprint.kind != cpu.KIND or target.fingerprint != cpu.host(self.store):
            return None
        digest = self.key(record, target, config).kernel
        slices = {DeviceFingerprint.from_dict(a.device): a for a in record.native} if config == DEFAULT_CONFIG else {}
        cached = {
            DeviceFingerprint.from_dict(e.device)
            for e in self.store.entries(Filter(kernel=record.name))
            if e.kernel_digest == digest and e.config == config
        }
        for fingerprint in cpu.serving_order(target.fingerprint, {*slices, *cached}):
            named = replace(target, fingerprint=fingerprint, flags=cpu.flags(fingerprint))
            key = self.key(record, named, config).hex
            hit = self.store.get(key)
            if hit is not None:
                return Native(hit[0], key, config, "cache", hit[1].finalize_s, named.label)
            if fingerprint in slices:
                native = Native(self.bundle.blob(slices[fingerprint].blob), key, config, "prebuilt", 0.0, named.label)
                self.store.put(key, native.data, self._entry(record, named, native))
                return native
        return None

    def _prebuilt(self, record: KernelRecord, target: Target) -> bytes | None:
        for artifact in record.native:
            if DeviceFingerprint.from_dict(artifact.device) == target.fingerprint:
                data = self.bundle.blob(artifact.blob)
                problem = code_problem(data, target.fingerprint)
                if problem is None:
                    return data
                warnings.warn(f"prebuilt {artifact.target} code of {record.name!r} ignored: {problem}")
        return None

    def _compile(self, record: KernelRecord, target: Target, config: str) -> bytes:
        if config != DEFAULT_CONFIG:
            from portkern.tuner.session import compile_config

            return compile_config(self.bundle, record, target, config)
        return toolchain_for(record).finalize(self.bundle, record, target)

    def _executable(self, record: KernelRecord, target: Target, native: Native):
        return toolchain_for(record).executable(native.data, record, target)

    def _entry(self, record: KernelRecord, target: Target, native: Native) -> Entry:
        stage, identity = self._stage(record, target)
        return Entry(
            key=native.key,
            kernel=record.name,
            bundle=self.bundle.name,
            bundle_digest=self.bundle.digest,
            device=target.fingerprint.to_dict(),
            device_label=target.label,
            config=native.config,
            format=toolchain_for(record).format,
            size=len(native.data),
            sha256="",
            compiler=compiler_id(record),
            flags=list(identity),
            kernel_digest=kernel_digest(record.kind, record.entry, stage.blob),
            finalize_s=native.finalize_s,
        )


class Kernel:
    """A kernel finalised for one device; call it with NumPy arrays."""

    def __init__(
        self, record: KernelRecord, target: Target, native: Native, executable, tuning: "TuneResult | None" = None,
        table: dict | None = None, bucket_tuning: list | None = None,
    ) -> None:
        self.record = record
        self.target = target
        self.native = native
        self._executable = executable
        #: The tuning result, when `kernel(..., tune=...)` asked for one.
        self.tuning = tuning
        #: Bucket label -> the bucket's tuned code (kernels with dynamic dimensions).
        self.buckets: dict = table or {}
        #: Per shape, what `kernel(..., shapes=[...])` found (tuner.buckets.BucketResult).
        self.bucket_tuning = bucket_tuning or []

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def signature(self) -> Signature:
        return self.record.signature

    @property
    def device(self) -> str:
        return self.target.label

    @property
    def config(self) -> str:
        return self.native.config

    @property
    def origin(self) -> str:
        return self.native.origin

    def __call__(self, *args: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        arrays = check_arguments(self.name, self.signature, args)
        executable = self._executable
        if self.buckets:
            _, _, code = buckets.pick(self.signature.contract, self.buckets, self.name, [a.shape for a in arrays])
            executable = code[1] if code is not None else executable
        results = executable(*arrays)
        return results[0] if len(results) == 1 else tuple(results)

    def code_for(self, *args: np.ndarray) -> dict:
        """Which code a call with these arguments runs: its bucket, origin and config."""
        arrays = check_arguments(self.name, self.signature, args)
        contract = self.signature.contract
        if contract is None or not contract.symbols:
            return {"bucket": "", "code": "static" if contract is not None else "unchecked", "origin": self.origin, "config": self.config}
        label, kind, code = buckets.pick(contract, self.buckets, self.name, [a.shape for a in arrays])
        if code is None:
            return {"bucket": label, "code": "dynamic", "origin": self.origin, "config": self.config}
        return {"bucket": label, "code": kind, "origin": code[0].origin, "config": code[0].config}

    def __repr__(self) -> str:
        return f"<Kernel {self.name} {self.signature} on {self.device} config={self.config} from {self.origin}>"
