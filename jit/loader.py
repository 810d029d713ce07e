"""`portkern.load(path).kernel(name, device=...)`: cached native code, callable on NumPy arrays.

The loader opens and checks a bundle, plans each kernel it is asked for, gets its native
code from the native-code service (`jit.native.NativeCode`, which a `LoadedBundle` holds)
and serves it. The config comes from the tuning DB (`cache.tuning`: a kernel's stored
selection), or, for `tune=` with a strategy that searches, from the `Tuning` the bundle was
opened with (`portkern.load` gives the tuner's); `jit` itself never tunes.
"""

from __future__ import annotations

import os
import warnings
import weakref
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence, cast, overload

import numpy as np

from portkern import schemas
from portkern.base import settings
from portkern.base.errors import (
    ArgumentTypeError,
    CompileForbiddenError,
    DeviceError,
    FinalizeError,
    KernelRuntimeError,
    PerfConfigError,
    PortkernError,
    SignatureError,
    TuningError,
    one_line,
)
from portkern.base.logs import logger
from portkern.cache.keys import validated_key
from portkern.cache.store import Store, default_store
from portkern.cache.tuning import TuningDB
from portkern.jit import devices
from portkern.jit.args import check_arguments, exact_arguments, static_inputs
from portkern.jit.native import DEFAULT_CONFIG, Native, NativeCode, Plan, Progress, check_toolchain, compiler_id, selection_problem
from portkern.jit.target import Target
from portkern.jit.tensors import result_wrapper
from portkern.jit.toolchain import Loaded, toolchain_for
from portkern.jit.vmcall import GPU_DRIVERS
from portkern.portable.bundle import Bundle, KernelRecord, Signature, decode_file, read_bundle_head
from portkern.portable.contract import UncheckedShapesWarning, arrange
from portkern.portable.dtypes import as_declared
from portkern.portable.producer import installed_compiler
from portkern.portable.source import CompatibilityWarning, describe, foreign_release
from portkern.portable.verify import check_kernels

if TYPE_CHECKING:
    from portkern.jit.background import Specialisation
    from portkern.jit.workers import Pool

log = logger(__name__)

#: `tune=` values that never search.
NO_SEARCH = (None, "none", "default")


class Tuned(Protocol):
    """A tuning result, as far as the loader reads it (the tuner's `TuneResult`)."""

    #: The kernel config string chosen ("default": the compiler's own).
    config: str
    #: "search" when it was searched for in this call.
    source: str
    #: Whether the kernel's calls run on the task executor whatever their size (timed faster there).
    executor: bool


class Tuning(Protocol):
    """What answers `tune=` with a strategy that searches (`portkern.load` gives the tuner's)."""

    def tune(self, natives: NativeCode, record: KernelRecord, target: Target, strategy: str) -> Tuned:
        """The kernel's config on the target: stored, or searched for now and stored."""
        ...

    def tune_shapes(self, natives: NativeCode, record: KernelRecord, target: Target, strategy: str, shapes: Sequence) -> list:
        """Tune a kernel with dynamic dimensions for each of `shapes` (its bucket decisions
        stored); what was found per shape."""
        ...


def load(
    path: str | Path, *, store: Store | None = None, pool: "Pool | None" = None, tuning: Tuning | None = None
) -> "LoadedBundle":
    """Open and check a bundle; nothing is compiled until a kernel is asked for. `store`: the
    cache (default: the one the environment names); `pool`: the worker pool that compiles its
    kernels (default: the process's shared pool); `tuning`: what answers `tune=` strategies
    that search (None: they are refused)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"load() takes a bundle's path (str or os.PathLike), got {type(path).__name__}")
    store = store if store is not None else default_store()
    schema = schemas.digest("bundle")
    seen: list[bool] = []

    def validated(digest: str) -> bool:
        seen.append(store.get_record("v", validated_key(digest, schema)) is not None)
        return seen[-1]

    data, size = read_bundle_head(path)
    bundle = decode_file(path, data, validated, size)
    try:
        check_signature(bundle, Path(path), data, store)
    except SignatureError:
        from portkern.cache import metrics

        metrics.refused(store, metrics.BUNDLE_SIGNATURE)
        raise
    check_kernels(bundle)
    foreign = foreign_release(bundle)
    if foreign:
        warnings.warn(
            f"{path}: built with {foreign}, IREE {installed_compiler().version} is installed: "
            "its kernels are compiled from their source stage", CompatibilityWarning, stacklevel=3,
        )
    if not any(seen):
        store.put_record("v", validated_key(bundle.digest, schema), {"bundle": bundle.name}, memo=True)
    return LoadedBundle(bundle, Path(path), store, pool, tuning)


def check_signature(bundle: Bundle, path: Path, data: bytes, store: Store) -> None:
    """Refuse a bundle whose signature does not verify with a trusted key (when trusted keys
    are configured), and an unsigned one under `PORTKERN_REQUIRE_SIGNATURE`, whether it
    carries prebuilt native code or only code to compile here; `data`: its bytes as read.
    A check that passed on this device before (remembered in `store`) needs no model-signing."""
    if not (settings.trusted_keys_file() or settings.require_signature() or settings.role()):
        return  # no trusted key, nothing required (the policy `signing.from_env` would give checks nothing)
    from portkern.base import signing
    from portkern.cache.verified import VerifiedSignatures

    signing.from_env().check_bundle(path, data if bundle.parameters is None else None, VerifiedSignatures(store))


class LoadedBundle:
    """A bundle opened on this machine: its kernels' native code (`natives`) and callable kernels."""

    def __init__(
        self, bundle: Bundle, path: Path, store: Store | None = None, pool: "Pool | None" = None, tuning: Tuning | None = None
    ) -> None:
        #: The native-code service of the bundle's kernels.
        self.natives = NativeCode(bundle, store if store is not None else default_store(), pool, path)
        #: What answers `tune=` with a strategy that searches (None: such a request is refused).
        self.tuning = tuning
        #: Loaded code by (kernel, driver, cache key, calls on the executor): the native bytes and their executable (held
        #: weakly: only kernels keep code loaded), so asking again for a kernel whose code is
        #: unchanged while one is still held does not load it into IREE again.
        self._loaded: dict[tuple[str, str, str, bool], tuple[bytes, weakref.ref[Loaded]]] = {}

    @property
    def bundle(self) -> Bundle:
        return self.natives.bundle

    @property
    def store(self) -> Store:
        return self.natives.store

    @property
    def path(self) -> Path | None:
        """The file the bundle was read from."""
        return self.natives.path

    @property
    def pool(self) -> "Pool":
        """The worker pool that compiles for this bundle."""
        return self.natives.pool

    def plan(self, record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> Plan:
        """The kernel's plan on a target (`NativeCode.plan`)."""
        return self.natives.plan(record, target, config)

    def key(self, record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG):
        """The cache key of the kernel's native code on a target (`NativeCode.key`)."""
        return self.natives.key(record, target, config)

    def native(self, record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> Native:
        """The kernel's native code for a target and config (`NativeCode.native`)."""
        return self.natives.native(record, target, config)

    def available(self, plan: Plan) -> Native | None:
        """Native code this machine already has for a plan, compiling nothing (`NativeCode.available`)."""
        return self.natives.available(plan)

    def parameters_for(self, record: KernelRecord):
        """The kernel's parameters, mapped and checked (`NativeCode.parameters_for`)."""
        return self.natives.parameters_for(record)

    def tuning_db(self, record: KernelRecord) -> TuningDB:
        """The tuning records for the compiler of `record`."""
        return TuningDB(self.store, compiler_id(record))

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def digest(self) -> str:
        return self.bundle.digest

    def __reduce__(self):
        raise ArgumentTypeError(
            f"a loaded bundle cannot be pickled (its native code is loaded in this process): give another "
            f"process the bundle's path and call portkern.load(path) there (bundle {self.natives.bundle.name!r})"
        )

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
        Where baseline code serves at once (origin "baseline"), the exact code,
        tuned when `tune` asks, is built in the background (`Kernel.wait`).
        For a kernel with dynamic dimensions, `shapes=[...]` (one entry per
        shape: a shape per argument, or {argument name: shape}) tunes now for
        those shapes' buckets; calls in a tuned bucket run its code, others the
        dynamic default.
        """
        record = self.record(name)
        if unchecked(record):
            warnings.warn(
                f"kernel {name!r} has no shape contract (built `unchecked: true`, or by an older portkern): "
                f"its calls with dynamic shapes are not checked",
                UncheckedShapesWarning,
                stacklevel=2,
            )
        target = devices.resolve(device, self.store)
        if not target.runnable:
            raise DeviceError(
                f"cannot run {name!r} on {target.label} here: {target.reason} "
                f"(use `portkern finalize --target {target.label}` to build for it ahead of time)"
            )
        check_toolchain(record, target)
        self.parameters_for(record)  # a bad parameter chunk fails here, before anything is compiled or cached
        if shapes is not None and tune in NO_SEARCH:
            raise TuningError(f"shapes= says what to tune {name!r} for; it needs a tuning strategy (tune='quick', ...)")
        later = settings.background()  # baseline code served while the exact code is built
        if later and shapes is None and tune not in NO_SEARCH:
            baseline = self._baseline(record, target)
            if baseline is not None:  # a cold device: tune in the background
                kernel = Kernel(record, target, baseline, self._executable(record, target, baseline), None, self._bucket_table(record, target))
                kernel._specialise(lambda: self.pool, lambda: self._final(record, target, tune))
                return kernel
        plan, native, tuning, executor = self._resolve(record, target, tune, baselines=later)
        buckets = None
        if shapes is not None and tune is not None:  # (shapes without a searching `tune` are refused above)
            buckets = self._tuner(tune).tune_shapes(self.natives, record, target, tune, shapes)
        try:
            executable = self._executable(record, target, native, executor)
        except KernelRuntimeError as exc:
            if native.origin not in ("cache", "remote"):
                raise
            log.warning("cached native code for %r on %s does not load (%s); rebuilding it", name, target.label, exc)
            self.natives.evict(plan)
            remote = self.store.remote
            if native.origin == "remote" and remote is not None:  # (remote code came from the remote tier)
                remote.reject_native(native.key, f"does not load: {exc}")
            native = self.natives.obtain(plan)
            executable = self._executable(record, target, native, executor)
        kernel = Kernel(record, target, native, executable, tuning, self._bucket_table(record, target), buckets, describe(plan.stage))
        if native.origin == "baseline":
            kernel._specialise(lambda: self.pool, lambda: self._final(record, target, tune))
        return kernel

    def _resolve(self, record: KernelRecord, target: Target, tune: str | None, baselines: bool) -> tuple:
        """(plan, native code, tuning result, calls on the executor) for a kernel: its config (tuned
        now if `tune` asks), then the code; a stored config that does not build is set aside for the default."""
        config, tuning, executor = self.config_for(record, target, tune)
        try:
            plan = self.plan(record, target, config)  # a config with module options needs a source stage
            native = self.natives.obtain(plan, baselines)
        except (FinalizeError, PerfConfigError) as exc:
            if config == DEFAULT_CONFIG or isinstance(exc, CompileForbiddenError):  # a policy, not a config that fails
                raise
            self._set_aside(record, target, config, exc)
            tuning, plan, executor = None, self.plan(record, target), False
            native = self.natives.obtain(plan, baselines)
        if tuning is not None and tuning.source == "search":
            native = replace(native, origin="tuned")
        return plan, native, tuning, executor

    def _final(self, record: KernelRecord, target: Target, tune: str | None) -> tuple:
        """The exact code (tuned if `tune` asks), loaded, and the tuning result: what a kernel
        served from a baseline switches to."""
        _, native, tuning, executor = self._resolve(record, target, tune, baselines=False)
        return native, self._executable(record, target, native, executor), tuning

    def _baseline(self, record: KernelRecord, target: Target) -> Native | None:
        """Baseline code for the default config, on a device that has neither the exact code nor
        a tuning result for this kernel yet (found without compiling anything)."""
        if self.tuning_db(record).selection(selection_problem(record, target), target.fingerprint) is not None:
            return None
        found = self.natives.available(self.plan(record, target))
        return found if found is not None and found.origin == "baseline" else None

    def _bucket_table(self, record: KernelRecord, target: Target) -> dict:
        """The tuned buckets' code of a kernel with dynamic dimensions (empty when none is tuned)."""
        contract = record.signature.contract
        if contract is None or not contract.symbols or not toolchain_for(record).tunable(record):
            return {}
        stored = self.tuning_db(record).buckets(selection_problem(record, target), target.fingerprint)
        from portkern.jit import buckets

        return buckets.load_table(self, record, target, stored)

    def prepare(
        self,
        device: str = "cpu",
        kernels: Sequence[str] | None = None,
        tune: str | None = None,
        workers: int | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Native | PortkernError]:
        """Warm up: native code for the bundle's kernels (default: all) on a device, the cold
        ones finalised concurrently on up to `workers` worker processes (default: one per
        core); never baseline code: warming up builds the exact code. The device need not be
        on this machine (code is built for it ahead of time). A kernel that fails holds its
        typed error; the others are still prepared.
        `tune` as for `kernel` (kernels are tuned one after another first)."""
        target = devices.resolve(device, self.store)
        records = [self.record(name) for name in (kernels if kernels is not None else self.names())]
        outcomes: dict[str, Native | PortkernError] = {}
        plans = []
        for record in records:
            try:
                plans.append(self.plan(record, target, self.config_for(record, target, tune)[0]))
            except PortkernError as exc:
                outcomes[record.name] = exc
        for plan, outcome in zip(plans, self.natives.obtain_many(plans, workers, progress, baselines=False)):
            outcomes[plan.name] = outcome
        return {record.name: outcomes[record.name] for record in records}

    def config_for(self, record: KernelRecord, target: Target, tune: str | None) -> tuple[str, Tuned | None, bool]:
        """The perf config to use (stored selection, default, or a fresh tuning result from
        `tuning`), the tuning result when `tune` asked for one, and whether the kernel's calls run
        on the task executor whatever their size (its tuning found them faster there)."""
        if tune not in NO_SEARCH and not toolchain_for(record).tunable(record):
            raise TuningError(
                f"{record.name!r} ({record.kind} kernel) runs with its manifest's launch sizes; it is not tuned "
                "(give it a parameter space: `tune: params:` in its manifest entry)"
            )
        if tune in NO_SEARCH:
            if tune is None:
                chosen = self.tuning_db(record).chosen(selection_problem(record, target), target.fingerprint)
                if chosen is not None:
                    return chosen[0], None, chosen[1]
            return DEFAULT_CONFIG, None, False
        result = self._tuner(tune).tune(self.natives, record, target, tune)
        return result.config, result, result.executor

    def _tuner(self, tune: str) -> Tuning:
        if self.tuning is None:
            raise TuningError(f"tune={tune!r} searches, and this bundle was opened without a tuner (open it with `portkern.load`)")
        return self.tuning

    def _set_aside(self, record: KernelRecord, target: Target, config: str, error: Exception) -> None:
        """Log that a stored config does not build, and mark its record so it is not used again."""
        reason = one_line(error, limit=300)
        log.warning(
            "stored tuning config %r of %r on %s does not build (%s); using the compiler's default and marking "
            "the stored result unusable", config[:80], record.name, target.label, reason,
        )
        self.tuning_db(record).set_aside(selection_problem(record, target), target.fingerprint, config, reason)

    def _executable(self, record: KernelRecord, target: Target, native: Native, executor: bool = False) -> Loaded:
        memo = (record.name, target.driver, native.key, executor)
        known = self._loaded.get(memo)
        executable = known[1]() if known is not None and known[0] == native.data else None
        if executable is None:
            executable = toolchain_for(record).executable(native.data, record, target, native.config, self.parameters_for(record), executor)
            self._loaded[memo] = (native.data, weakref.ref(executable))
        return executable


def unchecked(record: KernelRecord) -> bool:
    """Whether nothing checks a kernel's dynamic argument shapes: no shape contract (built
    `unchecked: true`, or by an older portkern) and no launch description."""
    return record.signature.contract is None and not record.launch and any(None in t.shape for t in record.signature.inputs)


class Kernel:
    """A kernel finalised for one device; call it with NumPy arrays."""

    def __init__(
        self, record: KernelRecord, target: Target, native: Native, executable, tuning: Tuned | None = None,
        table: dict | None = None, bucket_tuning: list | None = None, stage: str = "",
    ) -> None:
        self.record = record
        self.target = target
        self._code: tuple[Native, Loaded] = (native, executable)
        #: The tuning result, when `kernel(..., tune=...)` asked for one.
        self.tuning = tuning
        #: Bucket label -> the bucket's tuned code (kernels with dynamic dimensions).
        self.buckets: dict = table or {}
        #: Per shape, what `kernel(..., shapes=[...])` found (tuner.buckets.BucketResult).
        self.bucket_tuning = bucket_tuning or []
        #: The bundle stage its code was compiled from (`source (built with IREE ...)` for another release's bundle).
        self.stage = stage
        #: The exact code being built while baseline code serves (None when there is none).
        self.specialisation: Specialisation | None = None
        self._static = static_inputs(record.signature)
        #: No contract and no launch description check a call's dynamic shapes (`unchecked: true`).
        self._unchecked = unchecked(record)

    def _specialise(self, pool, build) -> None:
        """Run `build()` -> (native, executable, tuning) on `pool()`'s side in the background (the
        pool taken there) and switch to its code when it is ready (unless the kernel is gone by then)."""
        # The thread holds the kernel weakly: one abandoned at exit keeps no runtime object alive.
        kernel = weakref.ref(self)
        from portkern.jit import background

        def install(built) -> None:
            owner = kernel()
            if owner is None:
                return
            native, executable, tuning = built
            owner.tuning = tuning
            # One assignment swaps both: a call reads `_code` once and runs what it read.
            owner._code = (native, executable)

        self.specialisation = background.Specialisation(self.name, pool, build, install)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the exact code being built in the background (origin "baseline" until then).
        True when the kernel runs its final code: at once if nothing is pending; False on
        timeout, in a forked child of the process that started it, or when it failed (the
        kernel keeps its baseline; `specialisation.error` says why)."""
        job = self.specialisation
        if job is None:
            return True
        return job.wait(timeout) and job.error is None

    @property
    def native(self) -> Native:
        """The native code calls run now."""
        return self._code[0]

    @property
    def executable(self) -> Loaded:
        """The loaded code calls run now."""
        return self._code[1]

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

    @overload
    def __call__(self, *args: np.ndarray, **named: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]: ...

    @overload
    def __call__(self, *args: object, **named: object) -> Any: ...

    def __call__(self, *args: object, **named: object) -> Any:
        """Run on NumPy arrays or framework tensors (`__dlpack__`), in order or by the model's argument
        names (`k(x=a, w=b)`, `k(**{"gpu_0/data_0": a})`, or their identifiers); results are NumPy
        arrays, or torch tensors sharing their memory when every argument is a torch tensor."""
        if named:
            args = tuple(arrange(self.name, self.signature.contract, len(self.signature.inputs), args, named))
        arrays = exact_arguments(self._static, args) if self._static is not None else None
        if arrays is None and self.target.driver in GPU_DRIVERS:
            from portkern.jit import device_tensors  # loaded with the first call of a GPU kernel

            if device_tensors.on_gpu(args):
                return self._call_on_gpu(args)
        if arrays is None:
            arrays = check_arguments(self.name, self.signature, args, self._unchecked)
        executable = self._executable_for([a.shape for a in arrays])
        results = [as_declared(r, spec.dtype) for r, spec in zip(executable(*arrays), self.signature.results)]
        if self.specialisation is not None:  # the exact code's build begins after the first result
            self.specialisation.start()
        wrap = result_wrapper(args)
        if wrap is not None:
            tensors = [wrap(r) for r in results]
            return tensors[0] if len(tensors) == 1 else tuple(tensors)
        return results[0] if len(results) == 1 else tuple(results)

    def _executable_for(self, shapes: list) -> Loaded:
        """The loaded code a call with arguments of these shapes runs: its bucket's, or the kernel's."""
        contract = self.signature.contract
        if self.buckets and contract is not None:  # (a kernel has bucket code only with a shape contract)
            from portkern.jit import buckets

            _, _, code = buckets.pick(contract, self.buckets, self.name, shapes)
            if code is not None:
                return code[1]
        return self._code[1]

    def _call_on_gpu(self, args: Sequence[object]) -> Any:
        """A call on framework tensors in this kernel's GPU memory: results as tensors there (`jit.device_tensors`)."""
        from portkern.jit import device_tensors
        from portkern.jit.runtime import Executable
        from portkern.jit.vmcall import native_runtime

        driver, device = self.target.driver, cast(Executable, self._code[1]).hal_device  # (a GPU kernel's code is IREE's)
        hal = native_runtime()
        views = device_tensors.import_arguments(self.name, self.signature, args, driver, device, hal)
        executable = cast(Executable, self._executable_for([tuple(v.shape) for v in views]))
        tensors = device_tensors.export_results(executable.call_views(views, len(self.signature.results)), self.signature, device, hal)
        if self.specialisation is not None:
            self.specialisation.start()
        return tensors[0] if len(tensors) == 1 else tuple(tensors)

    def code_for(self, *args: np.ndarray) -> dict:
        """Which code a call with these arguments runs: its bucket, origin and config."""
        arrays = check_arguments(self.name, self.signature, args)
        contract = self.signature.contract
        if contract is None or not contract.symbols:
            return {"bucket": "", "code": "static" if contract is not None else "unchecked", "origin": self.origin, "config": self.config}
        from portkern.jit import buckets

        label, kind, code = buckets.pick(contract, self.buckets, self.name, [a.shape for a in arrays])
        if code is None:
            return {"bucket": label, "code": "dynamic", "origin": self.origin, "config": self.config}
        return {"bucket": label, "code": kind, "origin": code[0].origin, "config": code[0].config}

    def __reduce__(self):
        raise ArgumentTypeError(
            f"a Kernel cannot be pickled (its native code is loaded in this process): in another process, "
            f"call portkern.load(path).kernel({self.name!r}, device={self.device!r}) there"
        )

    def __repr__(self) -> str:
        return f"<Kernel {self.name} {self.signature} on {self.device} config={self.config} from {self.origin} ({self.stage})>"
