"""Tuning a kernel with dynamic dimensions per shape bucket.

For each shape asked for, the kernel's flow stage is specialised to the
shape's sizes (`portable.specialise`) and tuned as a static kernel by the
usual search; the winner is then timed side by side with the dynamic default
code on the same inputs, and the bucket keeps whichever is faster by
`min_gain` (rule: specialised code must beat the dynamic default, or
the dynamic default stays). The decision is stored per bucket in the tuning
DB (`jit.buckets.index_problem`), where the loader finds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from portkern.errors import ArgumentShapeError, PortkernError, TuningError
from portkern.jit.buckets import BucketRecord, index_problem, read_index, specialised_bundle
from portkern.portable.bundle import KernelRecord
from portkern.portable.compiler import Compiler
from portkern.tuner.measure import Bench, make_inputs

#: One shape to tune for: one shape per argument, or argument name/index -> shape.
Shapes = Sequence[Sequence[int]] | Mapping[str, Sequence[int]]


@dataclass
class BucketResult:
    """What tuning for one shape found."""

    kernel: str
    bucket: str
    values: dict[str, int]
    #: "specialised" or "dynamic".
    code: str
    config: str
    default_s: float | None = None
    best_s: float | None = None
    note: str = ""
    tuning: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        return self.default_s / self.best_s if self.default_s and self.best_s else None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "speedup": self.speedup}


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
        listed = []
        for index, spec in enumerate(record.signature.inputs):
            if index not in by_index and any(d is None for d in spec.shape):
                raise TuningError(f"{record.name!r}: the shapes to tune for leave out argument {index}, which has dynamic dimensions")
            listed.append(by_index.get(index, spec.shape))
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
    loaded,
    record: KernelRecord,
    target,
    strategy: str,
    shapes: Sequence[Shapes],
    *,
    tune: Callable[..., Any],
    problem: str,
    compiler: str,
    retune: bool = False,
    min_gain: float = 0.03,
    **options,
) -> list[BucketResult]:
    """Tune `record` for each shape (specialised per bucket) and store the decisions."""
    contract = record.signature.contract
    wanted = [bind_shapes(record, s) for s in shapes]
    if contract is None or not contract.symbols:
        raise TuningError(f"{record.name!r} has no dynamic dimensions; tune it without shapes")
    index_key = index_problem(problem)
    stored = read_index(loaded.store.get_tuning(index_key, target.fingerprint, compiler))
    results = []
    parser = Compiler()
    for values in wanted:
        label = contract.bucket_of(values)
        known = stored.get(label)
        if known is not None and dict(known.values) == values and not retune:
            results.append(BucketResult(record.name, label, values, known.code, known.config, known.default_s, known.best_s, known.note))
            continue
        decided, result = _tune_bucket(loaded, record, target, strategy, values, label, parser, tune, retune, min_gain, options)
        stored[label] = decided
        results.append(result)
    loaded.store.put_tuning(
        index_key, target.fingerprint, compiler, {"kernel": record.name, "buckets": {k: v.to_dict() for k, v in stored.items()}}
    )
    return results


def _tune_bucket(loaded, record, target, strategy, values, label, parser, tune, retune, min_gain, options) -> tuple[BucketRecord, BucketResult]:
    try:
        bundle, special = specialised_bundle(loaded.bundle, record, values, parser)
    except PortkernError as exc:
        raise TuningError(f"{record.name!r}: cannot specialise for {label}: {exc}") from None
    derived = type(loaded)(bundle, loaded.path, loaded.store)
    tuned = tune(derived, special, target, strategy, retune=retune, **options)
    native = derived.native(special, target, tuned.config)
    default = loaded.native(record, target)
    bench = Bench(record.entry, target.driver, make_inputs(special.signature))
    executables = [bench.load(default.data), bench.load(native.data)]
    dynamic_s, special_s = (t.min_s for t in bench.interleaved(executables))
    wins = special_s < dynamic_s * (1 - min_gain)
    note = (
        f"specialised code ({tuned.config}) beats the dynamic default"
        if wins
        else "the dynamic default is as fast as code specialised to these sizes; kept it"
    )
    stage = special.stage()
    decided = BucketRecord(label, values, "specialised" if wins else "dynamic", tuned.config, stage.blob, stage.size, dynamic_s, special_s, note)
    result = BucketResult(record.name, label, values, decided.code, tuned.config, dynamic_s, special_s, note, tuned.to_dict())
    return decided, result
