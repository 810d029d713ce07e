"""The OpenCL family: kernels whose manifest gives a parameter space; a perf config is one built point.

Such a kernel is its own single dispatch. Its space is the list of points the
build host compiled into the bundle (the default point first), so candidates
are never generated here, only chosen among. Each candidate is a program built
by the device's driver in a worker (`NativeCode.opencl_job`), checked against
the default point's outputs and timed with its buffers on the device
(`ClKernel.prepared`), at the shapes of the manifest's `tune: at:`. A point the
device cannot run (work-group too large, too much local memory) fails its
build job and counts as a failed candidate, with the reason.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

import numpy as np

from portkern.base.errors import PerfConfigError, PortkernError
from portkern.base.records import frozen_record
from portkern.cache.keys import opencl_problem
from portkern.jit.args import bind_launch
from portkern.jit.opencl_native import Executable
from portkern.jit.target import Target
from portkern.portable.bundle import KernelRecord, Signature, TensorSpec
from portkern.portable.launch import MAX_PARAMS, POINT_FAMILY, POINT_VERSION, Launch, launch_of, point_config
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.family import Family
from portkern.tuner.measure import Bench, make_inputs, time_calls
from portkern.tuner.perfconfig import VersionedConfig, parse_int, parse_token
from portkern.tuner.space import Stage

#: Candidates the `quick` strategy takes from a space (evenly spread over its points).
QUICK = 8


@frozen_record
class OpenclConfig(VersionedConfig):
    """One point of an OpenCL kernel's parameter space: `opencl:v1:NAME=value,...` in the space's order."""

    family = POINT_FAMILY
    version = POINT_VERSION
    tile_fields = ()
    params: tuple[tuple[str, int], ...]

    @property
    def rank(self) -> int:
        return len(self.params)

    def fields(self) -> list[str]:
        return [f"{name}={value}" for name, value in self.params]

    @classmethod
    def from_fields(cls, fields: list[str]) -> "OpenclConfig":
        if not 1 <= len(fields) <= MAX_PARAMS:
            raise PerfConfigError(f"{cls.family} perf config needs 1 to {MAX_PARAMS} NAME=value fields, got {len(fields)}")
        params = []
        for field in fields:
            name, sep, value = field.partition("=")
            if not sep:
                raise PerfConfigError(f"{cls.family} perf config field {field!r} is not NAME=value")
            params.append((parse_token(name, "parameter name"), parse_int(value, f"parameter {name}")))
        if len({n for n, _ in params}) != len(params):
            raise PerfConfigError(f"{cls.family} perf config {','.join(fields)!r} sets a parameter twice")
        return cls(tuple(params))

    def lowering_config(self) -> str:
        raise PerfConfigError("OpenCL configs are points of a built parameter space, not lowering configs")


def parse_point(text: str) -> OpenclConfig:
    """A point's config from its string form `opencl:v1:NAME=value,...`."""
    prefix = f"{POINT_FAMILY}:v{POINT_VERSION}:"
    if not text.startswith(prefix):
        raise PerfConfigError(f"{text!r} is not an {POINT_FAMILY} v{POINT_VERSION} perf config")
    return OpenclConfig.from_fields(text[len(prefix):].split(","))


class OpenclSpace:
    """The built points of one kernel; no cost model, so `guided` explores from the best measured point."""

    stages = (Stage("points", "deployed"),)

    def __init__(self, dispatch: Dispatch) -> None:
        self.dispatch = dispatch
        self.points = [parse_point(p) for p in dispatch.points]
        names = [name for name, _ in self.points[0].params]
        self._values = {name: sorted({dict(p.params)[name] for p in self.points}) for name in names}

    @property
    def default(self) -> OpenclConfig:
        return self.points[0]

    def stage_candidates(self, stage: int, bases: Sequence) -> list[OpenclConfig]:
        return self.points[1:]

    def quick_candidates(self, stage: int, bases: Sequence) -> list[OpenclConfig]:
        others = self.points[1:]
        if len(others) <= QUICK:
            return others
        return [others[(i * len(others)) // QUICK] for i in range(QUICK)]

    def joint(self) -> list[OpenclConfig]:
        return self.points[1:]

    def score(self, config) -> float:
        return 0.0

    def neighbors(self, config, pool: Sequence) -> list:
        """The points of `pool` one value step away from `config` in exactly one parameter."""
        here = dict(config.params)
        found = []
        for other in pool:
            there = dict(other.params)
            changed = [n for n in here if there.get(n) != here[n]]
            if len(changed) == 1:
                values = self._values[changed[0]]
                if abs(values.index(there[changed[0]]) - values.index(here[changed[0]])) == 1:
                    found.append(other)
        return found

    def prune_reason(self, config) -> str | None:
        return None if config in self.points else "not a point built into the bundle"


class OpenclBench(Bench):
    """OpenCL points of one kernel, run on the tuning inputs; timed launches reuse device buffers."""

    def __init__(self, record: KernelRecord, target: Target, inputs: Sequence[np.ndarray]) -> None:
        super().__init__(record.entry, target.driver, inputs)
        self.record, self.target = record, target
        self._prepared: dict[int, Callable[[], None]] = {}

    def load(self, vmfb: bytes, config: str = "default") -> Executable:
        return Executable(vmfb, self.record, self.target, config)

    def outputs(self, executable) -> list[np.ndarray]:
        return executable(*self.inputs)

    def time(self, executable, **options):
        key = id(executable)
        if key not in self._prepared:
            self._prepared[key] = executable.prepared(*self.inputs)
        return time_calls(self._prepared[key], **options)


class OpenclCandidates:
    """Points of an OpenCL kernel: built by the device's driver in a worker, run at the tuning shapes."""

    def __init__(self, natives: Any, record: KernelRecord, target: Target, launch: Launch) -> None:
        """`natives`: the `jit.native.NativeCode` of the kernel's bundle."""
        self.natives, self.record, self.target, self.launch = natives, record, target, launch
        shapes = iter(launch.tuning_shapes())
        specs = tuple(TensorSpec(next(shapes) if a.is_buffer else (), a.dtype) for a in launch.inputs)
        self.inputs = make_inputs(Signature(specs, ()))

    def job(self, id: int, config: str):
        return self.natives.opencl_job(id, self.natives.plan(self.record, self.target, config))

    def bench(self, driver: str) -> OpenclBench:
        return OpenclBench(self.record, self.target, self.inputs)

    def digest(self, config: str, code: bytes) -> str:
        """The program and its launch geometry: two points with one binary but other work sizes differ."""
        variant = self.launch.point(config)
        try:
            bound = bind_launch(self.record.name, self.launch, variant.local, self.inputs, variant.params)
            geometry = f"{variant.local}|{bound.global_size}|{sorted((k, int(v)) for k, v in bound.scalars.items())}"
        except PortkernError as exc:
            geometry = f"unbound {config}: {exc}"
        return hashlib.sha256(code + geometry.encode()).hexdigest()


class OpenclFamily(Family):
    name = POINT_FAMILY
    config = OpenclConfig

    def is_root(self, lowering_config: str) -> bool:
        return False

    def claims(self, target: str, lowering_configs: list[str]) -> bool:
        return False

    def claims_kernel(self, record: KernelRecord) -> bool:
        return bool(record.launch) and launch_of(record).tunable

    def kernel_tuning(self, natives: Any, record: KernelRecord, target: Target) -> tuple[list[Dispatch], OpenclCandidates]:
        launch = launch_of(record)
        points = [point_config(v.params).partition("=")[2] for v in launch.variants]
        space = [(name, sorted({dict(v.params)[name] for v in launch.variants})) for name in launch.params]
        at = ",".join(f"{k}={v}" for k, v in launch.tune_at)
        dispatch = Dispatch(
            index=0,
            name=record.entry,
            family=self.name,
            root="opencl.kernel",
            sizes=tuple(len(values) for _, values in space),
            parallel=(True,) * len(space),
            element_bytes=0,
            default=parse_point(points[0]),
            problem=opencl_problem(record.kind, record.entry, record.launch, [s.blob for s in record.stages], len(points), at),
            native_vector_bytes=0,
            requested=True,
            points=tuple(points),
        )
        return [dispatch], OpenclCandidates(natives, record, target, launch)

    def space(self, dispatch: Dispatch, threads: int) -> OpenclSpace | None:
        return OpenclSpace(dispatch) if len(dispatch.points) > 1 else None

    def no_space_reason(self, dispatch: Dispatch) -> str:
        return "the parameter space has one valid point"


FAMILY = OpenclFamily()
