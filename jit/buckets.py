"""Per-bucket native code of a kernel with dynamic dimensions, chosen at call time.

A kernel's shape contract puts each call in a bucket (`ShapeContract.bucket_of`).
Tuning for a shape (`tuner.buckets`) records, per bucket, the sizes it tuned
for and what won there: for exactly those sizes, code specialised to them or
the dynamic default; for every other size of the bucket, the dynamic module
with the bucket's tuned config, or the dynamic default. At `kernel(...)` time
the loader reads that record and loads each bucket's code; untuned buckets
run the dynamic default.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from portkern.base.errors import PortkernError
from portkern.base.records import from_plain, frozen_record, to_plain
from portkern.portable.bundle import Bundle, KernelRecord, Signature, Stage, TensorSpec
from portkern.portable.contract import ShapeContract

if TYPE_CHECKING:
    from portkern.jit.workers import Pool

log = logging.getLogger(__name__)


@frozen_record
class BucketRecord:
    """What tuning decided for one bucket."""

    label: str
    #: The symbol values it was tuned for.
    values: Mapping[str, int]
    #: For exactly `values`: "specialised" (code for those sizes) or "dynamic" (the dynamic default won).
    code: str
    #: The kernel config of the specialised code.
    config: str = "default"
    #: The config the dynamic module runs with for the bucket's other sizes ("default": none beat it).
    bucket_config: str = "default"
    #: sha256 and size of the specialised flow stage (its cache key is formed from them).
    stage: str = ""
    size: int = 0
    default_s: float | None = None
    best_s: float | None = None
    bucket_s: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BucketRecord":
        """A record from plain data, unchecked; TypeError when it is not a mapping or lacks a field."""
        return from_plain(cls, data)


@frozen_record
class BucketCode:
    """A bucket's loaded code: `exact` for calls with the record's values, `bucket` for its other sizes.

    Each is a (Native, executable) pair, or None where the dynamic default runs.
    """

    record: BucketRecord
    exact: tuple[Any, Any] | None
    bucket: tuple[Any, Any] | None


def read_index(stored: Mapping[str, Any] | None) -> dict[str, BucketRecord]:
    """Bucket records from a stored index (`cache.tuning.TuningDB.buckets`: {"buckets": {label:
    `BucketRecord.to_dict()`}}; malformed ones are left out)."""
    found = {}
    for label, data in ((stored or {}).get("buckets") or {}).items():
        try:
            record = BucketRecord.from_dict(data)
        except (TypeError, ValueError):
            continue
        if (
            isinstance(record.values, Mapping)
            and all(isinstance(k, str) and type(v) is int and v > 0 for k, v in record.values.items())
            and isinstance(record.config, str)
            and isinstance(record.stage, str)
            and type(record.size) is int
        ):
            found[label] = record
    return found


def specialised_name(name: str, values: Mapping[str, int]) -> str:
    """`gemm.M64.N128`: the name a specialisation's cache entries carry."""
    return ".".join([name] + [f"{k}{v}" for k, v in values.items()])


def specialised_record(record: KernelRecord, values: Mapping[str, int], blob: str, size: int) -> KernelRecord:
    """A kernel record for the code specialised to `values` (stage `blob`, static signature)."""
    contract = record.signature.contract
    assert contract is not None
    inputs = tuple(
        TensorSpec(tuple(d if isinstance(d, int) else values[d] for d in shape), spec.dtype)
        for shape, spec in zip(contract.inputs, record.signature.inputs)
    )
    results = tuple(
        TensorSpec(tuple(shape), spec.dtype) for shape, spec in zip(contract.result_shapes(values), record.signature.results)
    )
    base = record.stage()
    stage = Stage(base.phase, base.family, base.format, blob, size, base.producer)
    return replace(record, name=specialised_name(record.name, values), signature=Signature(inputs, results), stages=(stage,), native=())


def specialised_bundle(bundle: Bundle, record: KernelRecord, values: Mapping[str, int], pool: Pool) -> tuple[Bundle, KernelRecord]:
    """The bundle with a kernel specialised to `values` (by a worker of `pool`) added, and that kernel's record."""
    from portkern.jit.native import specialised_stage
    from portkern.portable.bundle import sha256

    contract = record.signature.contract
    assert contract is not None
    data = specialised_stage(pool, record, bundle.blob(record.stage().blob), dict(values))
    special = specialised_record(record, values, sha256(data), len(data))
    blobs = dict(bundle.blobs)
    blobs[special.stage().blob] = data
    return replace(bundle, kernels=bundle.kernels + (special,), blobs=blobs), special


def pick(contract: ShapeContract, table: Mapping[str, BucketCode], kernel: str, shapes: Sequence[Sequence[int]]) -> tuple[str, str, tuple | None]:
    """A call's bucket, which code it runs ("specialised", "bucket" or "dynamic"), and that
    code's (Native, executable) pair (None: the dynamic default)."""
    values = contract.bind(kernel, shapes)
    label = contract.bucket_of(values)
    code = table.get(label)
    if code is None:
        return label, "dynamic", None
    if code.exact is not None and dict(code.record.values) == values:
        return label, "specialised", code.exact
    if code.bucket is not None:
        return label, "bucket", code.bucket
    return label, "dynamic", None


def load_table(loaded, record: KernelRecord, target, stored: Mapping[str, Any] | None) -> dict[str, BucketCode]:
    """The specialised code of each tuned bucket of `record`, from the cache (or compiled again)."""
    table = {}
    contract = record.signature.contract
    for label, decided in read_index(stored).items():
        if contract is None or set(decided.values) != set(contract.symbols):
            continue
        exact = bucket = None
        try:
            if decided.code == "specialised":
                exact = _specialised_code(loaded, record, target, decided)
            if decided.bucket_config != "default":
                native = loaded.native(record, target, decided.bucket_config)
                bucket = (native, loaded._executable(record, target, native))
        except PortkernError as exc:
            log.warning("%r: the tuned code of bucket %s is not usable (%s); that bucket runs the dynamic default", record.name, label, exc)
            continue
        if exact is not None or bucket is not None:
            table[label] = BucketCode(decided, exact, bucket)
    return table


def _specialised_code(loaded, record: KernelRecord, target, decided: BucketRecord) -> tuple[Any, Any] | None:
    """The (Native, executable) of a bucket's specialised code: cached, or specialised and compiled again."""
    special = specialised_record(record, decided.values, decided.stage, decided.size)
    source = loaded
    if loaded.store.get(loaded.key(special, target, decided.config).hex, count=False) is None:
        bundle, special = specialised_bundle(loaded.bundle, record, decided.values, loaded.pool)
        if special.stage().blob != decided.stage:
            return None  # specialised differently now (another compiler): the bucket needs tuning again
        source = type(loaded)(bundle, loaded.path, loaded.store)
    native = source.native(special, target, decided.config)
    return native, source._executable(special, target, native)
