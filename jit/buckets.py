"""Per-bucket native code of a kernel with dynamic dimensions, chosen at call time.

A kernel's shape contract puts each call in a bucket (`ShapeContract.bucket_of`).
Tuning for a shape (`tuner.buckets`) records, per bucket, the sizes it tuned
for and the code that won: code specialised to those sizes (`specialised`),
or the dynamic default. At `kernel(...)` time the loader reads that record and
loads each bucket's code; a call uses it when its sizes are the ones the code
was made for, and the dynamic default otherwise (untuned buckets included).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from portkern.portable.bundle import Bundle, KernelRecord, Signature, Stage, TensorSpec
from portkern.portable.compiler import Compiler
from portkern.portable.contract import ShapeContract
from portkern.portable.specialise import specialise

#: What the tuning DB holds per kernel and target: {"buckets": {label: BucketRecord.to_dict()}}.
INDEX_SUFFIX = " buckets"


@dataclass(frozen=True)
class BucketRecord:
    """What tuning decided for one bucket."""

    label: str
    #: The symbol values it was tuned for.
    values: Mapping[str, int]
    #: "specialised" (code for exactly `values`) or "dynamic" (the dynamic default won).
    code: str
    #: The kernel config of the specialised code.
    config: str = "default"
    #: sha256 and size of the specialised flow stage (its cache key is formed from them).
    stage: str = ""
    size: int = 0
    default_s: float | None = None
    best_s: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if k == "values" else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BucketRecord":
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**fields)


@dataclass(frozen=True)
class BucketCode:
    """A bucket's loaded code: used for calls whose symbol values are `values`."""

    record: BucketRecord
    native: Any
    executable: Any


def index_problem(selection_problem: str) -> str:
    """The tuning-DB problem under which a kernel's bucket records are stored."""
    return selection_problem + INDEX_SUFFIX


def read_index(stored: Mapping[str, Any] | None) -> dict[str, BucketRecord]:
    """Bucket records from a stored index (malformed ones are left out)."""
    found = {}
    for label, data in ((stored or {}).get("buckets") or {}).items():
        try:
            record = BucketRecord.from_dict(data)
        except (TypeError, ValueError):
            continue
        if isinstance(record.values, Mapping) and all(isinstance(v, int) for v in record.values.values()):
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


def specialised_bundle(bundle: Bundle, record: KernelRecord, values: Mapping[str, int], compiler: Compiler) -> tuple[Bundle, KernelRecord]:
    """The bundle with a kernel specialised to `values` added, and that kernel's record."""
    from portkern.portable.bundle import sha256

    contract = record.signature.contract
    assert contract is not None
    data = specialise(compiler, bundle.blob(record.stage().blob), record.entry, contract, values, record.name)
    special = specialised_record(record, values, sha256(data), len(data))
    blobs = dict(bundle.blobs)
    blobs[special.stage().blob] = data
    return replace(bundle, kernels=bundle.kernels + (special,), blobs=blobs), special


def pick(contract: ShapeContract, table: Mapping[str, BucketCode], kernel: str, shapes: Sequence[Sequence[int]]) -> tuple[str, BucketCode | None]:
    """A call's bucket, and the bucket code it uses (None: the dynamic default)."""
    values = contract.bind(kernel, shapes)
    label = contract.bucket_of(values)
    code = table.get(label)
    if code is not None and dict(code.record.values) == values:
        return label, code
    return label, None


def load_table(loaded, record: KernelRecord, target, stored: Mapping[str, Any] | None) -> dict[str, BucketCode]:
    """The specialised code of each tuned bucket of `record`, from the cache (or compiled again)."""
    table = {}
    for label, decided in read_index(stored).items():
        if decided.code != "specialised":
            continue
        special = specialised_record(record, decided.values, decided.stage, decided.size)
        source = loaded
        if loaded.store.get(loaded.key(special, target, decided.config).hex, count=False) is None:
            bundle, special = specialised_bundle(loaded.bundle, record, decided.values, Compiler())
            if special.stage().blob != decided.stage:
                continue  # specialised differently now (another compiler): the bucket needs tuning again
            source = type(loaded)(bundle, loaded.path, loaded.store)
        native = source.native(special, target, decided.config)
        table[label] = BucketCode(decided, native, source._executable(special, target, native))
    return table
