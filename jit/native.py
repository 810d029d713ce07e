"""The one owner of native code: key, look up (this host's cache, then the fleet's remote tier),
lock, prebuilt code, a worker's compile, check, store (and share through the remote tier).

Loader and tuner both get native code through `NativeCode`; every worker job that compiles
kernel code or rewrites a stage is formed here (`compile_job`, `specialised_stage`, also for
tuning candidates, shape buckets and the build host's prebuilt code). A kernel is
planned once per request (`Plan`: its stage, what besides the stage selects
the code, its cache key). A cache hit starts no worker; everything a compiler
reads from the bundle is read in a worker of `portkern.jit.workers`, never in
this process.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

from portkern.base import settings
from portkern.base.errors import BundleError, CompileForbiddenError, DeviceError, FinalizeError, PortkernError
from portkern.base.logs import logger
from portkern.base.records import frozen_record
from portkern.cache import keys
from portkern.cache.device import DeviceFingerprint
from portkern.cache.keys import ArtifactKey, artifact_key, kernel_digest
from portkern.cache.store import Entry, Filter, Store
from portkern.jit import cpu
from portkern.jit.target import Target
from portkern.jit.toolchain import OPENCL, toolchain_for
from portkern.portable.bundle import Bundle, KernelRecord, Stage
from portkern.portable.source import describe, fitted_phase

if TYPE_CHECKING:  # the worker pool is loaded when something is compiled (a warm process never needs it)
    from portkern.jit.parameters import KernelParameters, MappedSection
    from portkern.jit.workers import Job, Pool, Result, Source

log = logger(__name__)

DEFAULT_CONFIG = "default"
#: The device kinds whose code objects `jit.codeobject` reads (other code is not inspected).
CODE_OBJECT_KINDS = ("amdgpu", "cuda")
#: Called as each kernel of a batch is done: (kernels done, kernels in the batch, the plan).
Progress = Callable[[int, int, "Plan"], None]


@frozen_record
class Native:
    """Native code for one kernel on one target, and where it came from."""

    data: bytes
    key: str
    config: str
    #: "cache", "remote" (the fleet's remote tier), "prebuilt", "finalized", "tuned" (searched for in
    #: this call), or "baseline" (code built for a CPU model or ISA level below this host's, e.g.
    #: `cpu:x86-64-v3`: it runs here, and the exact code can be built in the background).
    origin: str
    finalize_s: float = 0.0
    #: The device the code was built for (a named CPU's label when it serves this host's CPU).
    built_for: str = ""


@frozen_record
class Plan:
    """How one kernel becomes native code for one target, worked out once per request."""

    record: KernelRecord
    target: Target
    #: The stage finalised for the target.
    stage: Stage
    #: What besides the stage selects the native code (compiler flags, target attribute, options).
    identity: tuple[str, ...]
    #: The kernel's content digest (`cache.keys.kernel_digest`).
    kernel: str
    compiler: str
    config: str = DEFAULT_CONFIG
    key: ArtifactKey = field(init=False, compare=False)
    #: The cache key itself.
    hex: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        key = artifact_key(self.kernel, self.target.fingerprint, self.compiler, self.config, self.identity)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "hex", key.hex)

    @property
    def name(self) -> str:
        return self.record.name

    def with_config(self, config: str) -> "Plan":
        return replace(self, config=config)


def code_problem(data: bytes, fingerprint: DeviceFingerprint) -> str | None:
    """Why `data` is not native code for this GPU (`jit.codeobject.problem`); None for other devices' code."""
    if fingerprint.kind not in CODE_OBJECT_KINDS:
        return None
    from portkern.jit.codeobject import problem

    return problem(data, fingerprint)


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
    space = keys.opencl_space(record.launch, [s.blob for s in record.stages]) if record.launch else None
    return keys.selection_problem(kernel_digest(record.kind, record.entry, stage.blob), space)


# --- worker jobs: every job that compiles kernel code or rewrites a stage is formed here --------


def stage_source(bundle: Bundle, stage: Stage) -> Source:
    """A bundle stage as the workers read it (fitted to the target in the worker)."""
    from portkern.jit.workers import Source

    return Source(stage.blob, bundle.blob(stage.blob), fitted_phase(stage), stage.to_dict())


def compile_job(index: int, name: str, target: Target, source: Source, config: str = DEFAULT_CONFIG) -> Job:
    """The worker job that compiles `source` to native code for `target` with kernel config `config`
    ("default": the compiler's own); its result's `native` is the code. The service's own compiles,
    tuning candidates and prebuilt code are all compiled by jobs formed here."""
    from portkern.jit.workers import Job

    return Job.compile(index, name, target, source, config)


def specialised_stage(pool: Pool, record: KernelRecord, blob: bytes, values: dict[str, int]) -> bytes:
    """The kernel's flow stage `blob` with its dynamic sizes fixed to `values`, rewritten by a
    worker of `pool`; the typed error of the worker's failure otherwise."""
    from portkern.jit.workers import Job

    result = pool.run([Job.specialise(0, record.name, record.to_dict(), blob, dict(values))], workers=1)[0]
    if not result.ok:
        raise result.error_for(record.name)
    return result.data["stage"]


class Analysis(NamedTuple):
    """A kernel lowered to `executable-configurations` in a worker: the module as bytecode
    (fitted to its target) and its dispatches as plain data."""

    configured: bytes
    dispatches: list[dict]
    setup_s: float = 0.0


class NativeCode:
    """Native code for one bundle's kernels, through the cache and the worker pool."""

    def __init__(
        self, bundle: Bundle, store: Store, pool: Pool | None = None, path: Path | None = None, section: MappedSection | None = None
    ) -> None:
        self.bundle = bundle
        self.store = store
        self._pool = pool
        #: The file the bundle was read from (where its parameter section lies).
        self.path = path
        #: Its parameter section, the file opened now: a file renamed over `path` later is not read.
        self._section = section
        if section is None and bundle.parameters is not None and path is not None:
            from portkern.jit.parameters import MappedSection  # (loaded for bundles that have parameters)

            self._section = MappedSection(bundle, path, store)

    def derived(self, bundle: Bundle) -> "NativeCode":
        """The service for a bundle derived from this one (a kernel specialised and added): the
        same store, pool and bundle file (its parameter section as opened)."""
        return NativeCode(bundle, self.store, self._pool, self.path, self._section)

    @property
    def pool(self) -> Pool:
        """The worker pool that compiles for this bundle (the process's shared one by default)."""
        if self._pool is not None:
            return self._pool
        from portkern.jit.workers import shared_pool

        return shared_pool()

    def parameters_for(self, record: KernelRecord) -> KernelParameters | None:
        """The kernel's parameters, read or mapped (`jit.parameters`) and checked (None: it has none)."""
        if not record.parameters:
            return None
        if self._section is None:
            if self.path is None:
                raise BundleError(f"kernel {record.name!r} reads parameters, but bundle {self.bundle.name!r} was not read from a file")
            from portkern.jit.parameters import MappedSection  # (loaded for kernels that have parameters)

            self._section = MappedSection(self.bundle, self.path, self.store)
        return self._section.for_kernel(record)

    # --- planning ---------------------------------------------------------------

    def plan(self, record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> Plan:
        """The kernel's plan on a target; DeviceError if the target cannot take it."""
        check_toolchain(record, target)
        toolchain = toolchain_for(record)
        target = toolchain.target(target, config)
        stage, identity = toolchain.stage(self.bundle, record, target, config)
        kernel = kernel_digest(record.kind, record.entry, stage.blob)
        return Plan(record, target, stage, identity, kernel, toolchain.compiler_id(), config)

    def key(self, record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> ArtifactKey:
        return self.plan(record, target, config).key

    # --- getting native code ------------------------------------------------------

    def native(self, record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> Native:
        """Native code from the cache, the bundle's prebuilt slices, or a worker's finalisation."""
        return self.obtain(self.plan(record, target, config))

    def obtain(self, plan: Plan, baselines: bool = True) -> Native:
        """Native code for a plan; a typed error if it cannot be had. `baselines=False`: never
        code built for another CPU model (the exact code, compiled if need be)."""
        (outcome,) = self.obtain_many([plan], workers=1, baselines=baselines)
        if isinstance(outcome, PortkernError):
            raise outcome
        return outcome

    def obtain_many(
        self, plans: Sequence[Plan], workers: int | None = None, progress: Progress | None = None, baselines: bool = True
    ) -> list[Native | PortkernError]:
        """Native code for every plan, the cold ones compiled concurrently on up to `workers`
        workers; a failed kernel's place holds its typed error instead. `baselines` as for `obtain`."""
        # Code at hand (cached, the fleet's, prebuilt, or built for a CPU this host runs) needs no build lock.
        outcomes: list[Native | PortkernError | None] = [
            self.cached(plan) or self._from_remote(plan, count=True) or self._prebuilt(plan) or self._named_cpu(plan, baselines) for plan in plans
        ]
        done = sum(o is not None for o in outcomes)
        if progress is not None and done:
            progress(done, len(plans), plans[0])
        cold = sorted({plans[i].hex: i for i, o in enumerate(outcomes) if o is None}.items())
        remote = self.store.remote
        with ExitStack() as locks:
            jobs: dict[int, tuple[Job, Plan]] = {}
            for hex_key, index in cold:
                plan = plans[index]
                # Waited for no longer than the holder's compile may run: a holder that has not stored
                # the code by then (stopped, or building many kernels) leaves this one to build it too.
                locks.enter_context(self.store.lock(hex_key, timeout=settings.compile_timeout_s()))
                fleet_wide = locks.enter_context(remote.lock(hex_key, plan.name)) if remote is not None else False
                # (built meanwhile by another process, here or in the fleet)
                outcome: Native | PortkernError | None = self.cached(plan, count=False) or (self._from_remote(plan) if fleet_wide else None)
                if outcome is None:
                    try:
                        jobs[index] = (self._job(index, plan), plan)
                    except PortkernError as exc:
                        outcome = exc
                outcomes[index] = outcome
                if outcome is not None:
                    done += 1
                    if progress is not None:
                        progress(done, len(plans), plan)

            def finished(job: Job, result: Result) -> None:
                nonlocal done
                plan = jobs[job.id][1]
                outcomes[job.id] = self._store(plan, result)
                done += 1
                if progress is not None:
                    progress(done, len(plans), plan)

            if jobs:
                self.pool.run([job for job, _ in jobs.values()], on_result=finished, workers=workers)
        found: list[Native | PortkernError] = []
        for plan, outcome in zip(plans, outcomes):  # a plan that shares its key with another shares its code
            found.append(outcome if outcome is not None else next(o for p, o in zip(plans, outcomes) if p.hex == plan.hex and o is not None))
        return found

    def cached(self, plan: Plan, count: bool = True) -> Native | None:
        """The plan's cache entry, unless it is GPU code for another arch (then it is evicted)."""
        hit = self.store.get(plan.hex, count=count)
        if hit is None:
            return None
        problem = code_problem(hit[0], plan.target.fingerprint)
        if problem is not None:
            log.warning("cache entry %s is not code for %s (%s); evicted", plan.hex[:16], plan.target.label, problem)
            self.store.delete(plan.hex)
            return None
        return Native(hit[0], plan.hex, plan.config, "cache", hit[1].finalize_s, plan.target.label)

    def available(self, plan: Plan) -> Native | None:
        """Native code this machine already has for a plan: the local cache, the bundle's prebuilt
        code, or code for a CPU model this host runs (origin "baseline" when it is below this
        host's); None when it would be compiled. Compiles nothing and asks no remote tier."""
        return self.cached(plan, count=False) or self._prebuilt(plan) or self._named_cpu(plan)

    def evict(self, plan: Plan) -> None:
        """Drop the plan's cache entry (it does not load)."""
        self.store.delete(plan.hex)

    def put(self, plan: Plan, data: bytes, finalize_s: float = 0.0, kernel_time_s: float | None = None) -> Native:
        """Cache native code built elsewhere (the tuner's winning candidate), with the kernel
        time the tuner measured for it."""
        native = Native(data, plan.hex, plan.config, "finalized", finalize_s, plan.target.label)
        entry = self.entry(plan, native)
        entry.kernel_time_s = kernel_time_s
        self.store.put(plan.hex, data, entry)
        self._publish(plan, native)
        return native

    def put_native(
        self, record: KernelRecord, target: Target, config: str, data: bytes, finalize_s: float = 0.0, kernel_time_s: float | None = None
    ) -> Native:
        """`put` for a kernel, target and config."""
        return self.put(self.plan(record, target, config), data, finalize_s, kernel_time_s)

    def entry(self, plan: Plan, native: Native) -> Entry:
        """The cache metadata of native code for a plan."""
        return Entry(
            key=native.key,
            kernel=plan.record.name,
            bundle=self.bundle.name,
            bundle_digest=self.bundle.digest,
            device=plan.target.fingerprint.to_dict(),
            device_label=plan.target.label,
            config=native.config,
            format=toolchain_for(plan.record).format,
            size=len(native.data),
            sha256="",
            compiler=plan.compiler,
            flags=list(plan.identity),
            kernel_digest=plan.kernel,
            finalize_s=native.finalize_s,
            stage=describe(plan.stage),
        )

    # --- work for the tuner ---------------------------------------------------------

    def source(self, plan: Plan) -> Source:
        """The plan's stage as the workers read it."""
        return stage_source(self.bundle, plan.stage)

    def opencl_job(self, index: int, plan: Plan) -> Job:
        """The worker job that builds an OpenCL kernel's program for the plan's config
        (carrying only that variant's stages)."""
        from portkern.jit import opencl_native
        from portkern.jit.workers import Job

        blobs = opencl_native.variant_blobs(self.bundle.blobs, plan.record, plan.target, plan.config)
        return Job.opencl(index, plan.name, plan.target, plan.record.to_dict(), blobs, plan.config)

    def analyse(self, plan: Plan) -> Analysis:
        """The kernel lowered to `executable-configurations` by a worker, and its dispatches."""
        from portkern.jit.workers import Job

        toolchain_for(plan.record).check(plan.stage, plan.name)
        result = self.pool.run([Job.analyse(0, plan.name, plan.target, self.source(plan))], workers=1)[0]
        if not result.ok:
            raise result.error_for(plan.name, plan.target)
        return Analysis(result.data["configured"], list(result.data["dispatches"]), result.setup_s)

    # --- inside obtain_many -----------------------------------------------------------

    def _from_remote(self, plan: Plan, count: bool = False) -> Native | None:
        """Native code from the remote tier, checked for this device and copied into the local cache."""
        remote = self.store.remote
        if remote is None:
            return None
        from portkern.cache import metrics
        from portkern.cache.remote import REFUSED as REMOTE_REFUSED  # imported with the store's remote tier

        lookup = remote.lookup_native(plan.hex)
        outcome, fetched = lookup.outcome, lookup.fetched
        if fetched is not None:
            problem = code_problem(fetched.data, plan.target.fingerprint)
            if problem is not None:
                remote.reject_native(plan.hex, f"not code for {plan.target.label}: {problem}")
                outcome, fetched = REMOTE_REFUSED, None
        metrics.remote_lookup(self.store, outcome, counted=count)
        if fetched is None:
            return None
        native = Native(fetched.data, plan.hex, plan.config, "remote", fetched.meta.get("finalize_s", 0.0), plan.target.label)
        self.store.put(plan.hex, fetched.data, self.entry(plan, native))
        return native

    def _publish(self, plan: Plan, native: Native) -> None:
        """Share native code built here through the remote tier, if there is one."""
        if self.store.remote is not None:
            meta = {"config": native.config, "format": toolchain_for(plan.record).format, "finalize_s": native.finalize_s}
            self.store.remote.put_native(native.key, native.data, meta)

    def _prebuilt(self, plan: Plan) -> Native | None:
        if plan.config != DEFAULT_CONFIG or plan.stage.is_source:  # prebuilt code is another release's
            return None
        for artifact in plan.record.native:
            if DeviceFingerprint.from_dict(artifact.device) == plan.target.fingerprint:
                data = self.bundle.blob(artifact.blob)
                problem = code_problem(data, plan.target.fingerprint)
                if problem is None:
                    native = Native(data, plan.hex, plan.config, "prebuilt", 0.0, plan.target.label)
                    self.store.put(plan.hex, data, self.entry(plan, native))
                    return native
                log.warning("prebuilt %s code of %r ignored: %s", artifact.target, plan.name, problem)
        return None

    def _named_cpu(self, plan: Plan, baselines: bool = True) -> Native | None:
        """Code built for a named CPU whose every feature this host has, from the cache or the
        bundle's prebuilt slices, most specific CPU first; only for this host's own CPU. Code for
        another CPU model (an ISA level such as x86-64-v3, an older CPU) is a "baseline", and
        only taken when `baselines`."""
        target = plan.target
        if target.fingerprint.kind != cpu.KIND or target.fingerprint != cpu.host(self.store):
            return None
        own_release = plan.config == DEFAULT_CONFIG and not plan.stage.is_source  # prebuilt slices are the bundle's release's
        slices = {DeviceFingerprint.from_dict(a.device): a for a in plan.record.native} if own_release else {}
        cached = {
            DeviceFingerprint.from_dict(e.device)
            for e in self.store.entries(Filter(kernel=plan.name))
            if e.kernel_digest == plan.kernel and e.config == plan.config
        }
        for fingerprint in cpu.serving_order(target.fingerprint, {*slices, *cached}):
            baseline = cpu.is_baseline(fingerprint, target.fingerprint)
            if baseline and not baselines:
                continue
            named = self.plan(plan.record, replace(target, fingerprint=fingerprint, flags=cpu.flags(fingerprint)), plan.config)
            hit = self.store.get(named.hex)
            if hit is not None:
                native = Native(hit[0], named.hex, plan.config, "baseline" if baseline else "cache", hit[1].finalize_s, named.target.label)
            elif fingerprint in slices:
                origin = "baseline" if baseline else "prebuilt"
                native = Native(self.bundle.blob(slices[fingerprint].blob), named.hex, plan.config, origin, 0.0, named.target.label)
                self.store.put(named.hex, native.data, self.entry(named, native))
            else:
                continue
            if not baseline:  # as good as this CPU's own code: kept as that, a direct hit from now on
                own = replace(native, key=plan.hex, origin="cache", built_for=plan.target.label)
                self.store.put(plan.hex, own.data, self.entry(plan, own))
            return native
        return None

    def _job(self, index: int, plan: Plan) -> Job:
        if settings.compile_mode() == settings.COMPILE_NEVER:
            from portkern.cache import metrics

            metrics.refused(self.store, metrics.COMPILE_FORBIDDEN)
            config = "" if plan.config == DEFAULT_CONFIG else f" (config {plan.config[:80]!r})"
            raise CompileForbiddenError(
                f"{plan.name!r} has no native code for {plan.target.label}{config} here, and compiling is turned off "
                f"({settings.COMPILE}={settings.COMPILE_NEVER}): finalise it ahead of time "
                f"(`portkern finalize BUNDLE --target {plan.target.label}`) or import its code (`portkern cache import`)"
            )
        toolchain = toolchain_for(plan.record)
        toolchain.check(plan.stage, plan.name)
        if toolchain is OPENCL:
            return self.opencl_job(index, plan)
        return compile_job(index, plan.name, plan.target, self.source(plan), plan.config)

    def _store(self, plan: Plan, result: Result) -> Native | PortkernError:
        from portkern.cache import metrics  # (counted where something was compiled)

        metrics.compiled(self.store, result.wall_s, result.ok)
        if not result.ok:
            return result.error_for(plan.name, plan.target)
        data = result.data.get("native")
        if not isinstance(data, bytes) or not data:
            return FinalizeError(f"finalising {plan.name!r} for {plan.target.label} gave no native code")
        from portkern.jit.codeobject import check as check_code

        try:
            check_code(data, plan.target.fingerprint)
        except PortkernError as exc:
            return exc
        native = Native(data, plan.hex, plan.config, "finalized", result.wall_s, plan.target.label)
        self.store.put(plan.hex, data, self.entry(plan, native))
        self._publish(plan, native)
        return native
