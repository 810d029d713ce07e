"""Tuning a kernel with dynamic dimensions per shape bucket.

For each shape asked for, the kernel's flow stage is specialised to the
shape's sizes (`portable.specialise`) and tuned as a static kernel by the
usual search. Its winning config is also stamped on the dynamic module. The
dynamic default, the specialised winner and the dynamic module with the
winning config are then timed side by side on the shape's inputs, and chosen
by rule:

- for exactly these sizes, the specialised code if it beats the dynamic
  default by `min_gain`, else the dynamic default;
- for the bucket's other sizes, the dynamic module with the tuned config if it
  beats the dynamic default by `min_gain`, else the dynamic default.

"Beats" means in every one of `REPEATS` interleaved timings of the three in the
same run (`verdict`): a win that one burst of load made is not kept, so a
bucket's tuned code is never kept where it is not faster than its default.

Compile times of both are reported (each is compiled once and then cached).
The decisions are stored per bucket in the tuning DB
(`cache.tuning.TuningDB.put_buckets`), where the loader finds them.
"""

from __future__ import annotations

import time
from dataclasses import field
from typing import Any, Callable, Mapping, Sequence

from portkern.base.errors import ArgumentShapeError, PortkernError, TuningError, one_line
from portkern.base.records import frozen_record, record, to_plain
from portkern.cache.tuning import TuningDB
from portkern.jit.buckets import BucketRecord, read_index, specialised_bundle
from portkern.jit.native import NativeCode
from portkern.portable.bundle import KernelRecord
from portkern.tuner.measure import Bench, call_driver_of, make_inputs

#: One shape to tune for: one shape per argument, or argument name/index -> shape.
Shapes = Sequence[Sequence[int]] | Mapping[str, Sequence[int]]
#: Interleaved timings of a bucket's dynamic default and tuned code, each of which tuned code must win.
REPEATS = 3


@frozen_record
class Verdict:
    """What a bucket keeps: `specialised` code for its exact sizes, the `tuned` dynamic config for its others."""

    specialised: bool
    tuned: bool


def verdict(repeats: Sequence[Sequence[float | None]], min_gain: float) -> Verdict:
    """A bucket's choice from its timings: per repeat (interleaved, side by side, one run), seconds
    of the dynamic default, the specialised code and the dynamic module with the tuned config (None:
    not built). Tuned code is kept only where it beats the default by `min_gain` in every repeat."""

    def wins(column: int) -> bool:
        for r in repeats:
            default, tuned = r[0], r[column] if len(r) > column else None
            if default is None or tuned is None or not tuned < default * (1 - min_gain):
                return False
        return bool(repeats)

    return Verdict(wins(1), wins(2))


@record
class BucketResult:
    """What tuning for one shape found."""

    kernel: str
    bucket: str
    values: dict[str, int]
    #: For exactly `values`: "specialised" or "dynamic".
    code: str
    config: str
    default_s: float | None = None
    best_s: float | None = None
    note: str = ""
    #: For the bucket's other sizes: the dynamic module's config ("default": the dynamic default).
    bucket_config: str = "default"
    bucket_s: float | None = None
    specialised_compile_s: float | None = None
    bucket_compile_s: float | None = None
    tuning: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        return self.default_s / self.best_s if self.default_s and self.best_s else None

    def to_dict(self) -> dict[str, Any]:
        return {**to_plain(self), "speedup": self.speedup}


def bind_shapes(record: KernelRecord, shapes: Shapes) -> dict[str, int]:
    """The symbol values of one shape to tune for, checked against the signature and contract."""
    contract = record.signature.contract
    if contract is None:
        raise TuningError(f"{record.name!r} has no shape contract, so its dynamic dimensions cannot be tuned per bucket")
    if isinstance(shapes, Mapping):
        by_index: dict[int, Sequence[int]] = {}
        for name, shape in shapes.items():
            index = contract.arg_index(str(name))
            if index is None:
                known = ", ".join(contract.names or [f"arg{i}" for i in range(len(contract.inputs))])
                raise TuningError(f"{record.name!r} has no argument {name!r} (arguments: {known})")
            by_index[index] = shape
        listed: list[Sequence[int]] = []
        for index, spec in enumerate(record.signature.inputs):
            if index in by_index:
                listed.append(by_index[index])
                continue
            static = tuple(d for d in spec.shape if d is not None)
            if len(static) != len(spec.shape):
                raise TuningError(f"{record.name!r}: the shapes to tune for leave out argument {index}, which has dynamic dimensions")
            listed.append(static)
    else:
        listed = list(shapes)
    if len(listed) != len(record.signature.inputs):
        raise TuningError(f"{record.name!r} takes {len(record.signature.inputs)} arguments; a shape to tune for lists {len(listed)}")
    for index, (shape, spec) in enumerate(zip(listed, record.signature.inputs)):
        if len(shape) != len(spec.shape) or any(w is not None and w != h for w, h in zip(spec.shape, shape)):
            raise TuningError(f"{record.name!r}: shape {tuple(shape)} does not fit argument {index} ({spec})")
        if any(type(d) is not int or d < 1 for d in shape):
            raise TuningError(f"{record.name!r}: shape {tuple(shape)} of argument {index} must have positive sizes")
    try:
        return contract.bind(record.name, listed)
    except ArgumentShapeError as exc:
        raise TuningError(f"cannot tune for these shapes: {exc}") from None


def tune_shapes(
    natives: NativeCode,
    record: KernelRecord,
    target,
    strategy: str,
    shapes: Sequence[Shapes],
    *,
    tune: Callable[..., Any],
    compile_dynamic: Callable[..., bytes],
    problem: str,
    compiler: str,
    retune: bool = False,
    min_gain: float = 0.03,
    **options,
) -> list[BucketResult]:
    """Tune `record` (a kernel of the bundle `natives` serves) for each shape, specialised per
    bucket, and store the decisions under its selection `problem` for `compiler`."""
    contract = record.signature.contract
    wanted = [bind_shapes(record, s) for s in shapes]
    if contract is None or not contract.symbols:
        raise TuningError(f"{record.name!r} has no dynamic dimensions; tune it without shapes")
    db = TuningDB(natives.store, compiler)
    stored = read_index(db.buckets(problem, target.fingerprint))
    results = []
    for values in wanted:
        label = contract.bucket_of(values)
        known = stored.get(label)
        if known is not None and dict(known.values) == values and not retune:
            results.append(
                BucketResult(
                    record.name, label, values, known.code, known.config, known.default_s, known.best_s, known.note,
                    bucket_config=known.bucket_config, bucket_s=known.bucket_s,
                )
            )
            continue
        decided, result = _tune_bucket(natives, record, target, strategy, values, label, (tune, compile_dynamic), retune, min_gain, options)
        stored[label] = decided
        results.append(result)
    db.put_buckets(problem, target.fingerprint, record.name, {k: v.to_dict() for k, v in stored.items()})
    return results


def _tune_bucket(natives: NativeCode, record, target, strategy, values, label, tools, retune, min_gain, options) -> tuple[BucketRecord, BucketResult]:
    tune, compile_dynamic = tools
    try:
        bundle, special = specialised_bundle(natives.bundle, record, values, natives.pool)
    except PortkernError as exc:
        raise TuningError(f"{record.name!r}: cannot specialise for {label}: {exc}") from None
    derived = natives.derived(bundle)
    tuned = tune(derived, special, target, strategy, retune=retune, **options)
    native = derived.native(special, target, tuned.config)
    default = natives.native(record, target)
    vmfbs = [default.data, native.data]
    bucket_compile_s, note = None, ""
    if tuned.config != "default":
        started = time.perf_counter()
        try:
            vmfbs.append(compile_dynamic(natives.bundle, record, target, tuned.config))
            bucket_compile_s = time.perf_counter() - started
        except PortkernError as exc:
            note = f"the tuned config does not fit the dynamic module ({one_line(exc, limit=300)}); "
    inputs, parameters = make_inputs(special.signature), natives.parameters_for(record)
    bench = Bench(record.entry, call_driver_of(target.driver, inputs, parameters), inputs, parameters)
    executables = [bench.load(v) for v in vmfbs]
    repeats: list[list[float | None]] = [[t.min_s for t in bench.interleaved(executables)] for _ in range(REPEATS)]
    chosen = verdict(repeats, min_gain)
    wins, bucket_wins = chosen.specialised, chosen.tuned
    # the times reported: each one's best over the repeats
    dynamic_s, special_s = (min(r[i] or float("inf") for r in repeats) for i in (0, 1))
    bucket_s = min(r[2] or float("inf") for r in repeats) if len(vmfbs) > 2 else None
    if bucket_wins:
        natives.put_native(record, target, tuned.config, vmfbs[2], bucket_compile_s or 0.0, bucket_s)
    note += (
        ("specialised code beats the dynamic default at these sizes" if wins else "the dynamic default is as fast as specialised code at these sizes")
        + ("; the tuned config serves the bucket's other sizes" if bucket_wins else "; the bucket's other sizes run the dynamic default")
    )
    bucket_config = tuned.config if bucket_wins else "default"
    stage = special.stage()
    decided = BucketRecord(
        label, values, "specialised" if wins else "dynamic", tuned.config, bucket_config, stage.blob, stage.size, dynamic_s, special_s, bucket_s, note
    )
    result = BucketResult(
        record.name, label, values, decided.code, tuned.config, dynamic_s, special_s, note, bucket_config=bucket_config, bucket_s=bucket_s,
        specialised_compile_s=native.finalize_s or None, bucket_compile_s=bucket_compile_s, tuning=tuned.to_dict(),
    )
    return decided, result
