"""Fuzzed bundles (re-sealed mutations of four kinds) are refused with a typed error or run correctly,
and a failing case never stops the next valid kernel. bench/fuzz.py runs 10,000 such cases."""

from __future__ import annotations

import numpy as np
import pytest
from fuzzing import KINDS, SOURCE_FORMATS, build_seed, cases, references, run_case, tally
from helpers import opencl_device_missing, opencl_toolchain_missing

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.portable.producer import installed_compiler
from portkern.portable.source import CompatibilityWarning

#: Cases per CI run (the kinds in turn); each that reaches a compile costs a worker job.
CASES = 240
#: Cases on the seed of another IREE release, whose kernels compile from their source stages.
SOURCE_CASES = 24
#: The release the foreign seed claims to be built with.
OTHER = "3.12.0"
SEED = 20261123


def device_for(record) -> str:
    return "opencl" if any(s.format == "spirv" for s in record.stages) else "cpu"


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    opencl = not (opencl_toolchain_missing() or opencl_device_missing())
    return build_seed(tmp_path_factory.mktemp("fuzz-seed"), opencl)


@pytest.fixture(autouse=True)
def short_compile_bound(monkeypatch):
    """Mutated bytecode can make MLIR's reader loop for good; such a case costs this bound."""
    monkeypatch.setenv("PORTKERN_COMPILE_TIMEOUT", "20")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return Store(CacheConfig(tmp_path_factory.mktemp("fuzz-cache"), 1 << 30, False))


def test_fuzzed_bundles_are_refused_or_run_correctly(seed, store, tmp_path):
    refs = references(seed, store, device_for)
    outcomes = [run_case(case, tmp_path / "case.pkb", store, refs, device_for) for case in cases(seed.read_bytes(), CASES, SEED)]
    findings = [f"{o.case.kind} #{o.case.index} ({o.case.what}): {o.result}: {o.detail}" for o in outcomes if o.result not in ("refused", "ran")]
    assert not findings, "\n".join(findings)
    counts = tally(outcomes)
    assert all(sum(counts[kind].values()) == CASES // len(KINDS) for kind in KINDS)
    assert counts["raw"].get("refused") and counts["metadata"].get("refused")
    # some mutated blobs get as far as a worker's compiler, and are refused there
    assert any(o.case.kind == "blob" and o.result == "refused" and "FinalizeError" in o.detail for o in outcomes)


def test_after_a_failing_case_the_next_valid_kernel_runs(seed, store, tmp_path):
    refs = references(seed, store, device_for)
    failing = next(
        case for case in cases(seed.read_bytes(), 400, SEED + 1)
        if case.kind == "blob" and (o := run_case(case, tmp_path / "case.pkb", store, refs, device_for)).result == "refused"
        and "FinalizeError" in o.detail
    )
    assert failing.kind == "blob"
    fresh = Store(CacheConfig(tmp_path / "fresh", 1 << 30, False))
    bundle = portkern.load(seed, store=fresh)
    for name, ref in refs.items():
        kernel = bundle.kernel(name, device=device_for(bundle.record(name)))
        assert kernel.origin == "finalized"
        got = kernel(*ref.inputs)
        for out, want in zip(got if isinstance(got, tuple) else (got,), ref.outputs):
            np.testing.assert_array_equal(out, want)


@pytest.mark.filterwarnings("ignore::portkern.portable.source.CompatibilityWarning")
def test_fuzzed_source_stages_are_refused_or_run_correctly(tmp_path_factory, tmp_path):
    pytest.importorskip("onnx", reason="the seed's ONNX model needs the 'onnx' package")
    seed = build_seed(tmp_path_factory.mktemp("foreign-seed"), opencl=False, onnx=True, foreign=OTHER)
    store = Store(CacheConfig(tmp_path / "cache", 1 << 30, False))
    with pytest.warns(CompatibilityWarning):
        refs = references(seed, store, device_for)
    assert {e.stage for e in store.entries()} == {f"source (built with IREE {OTHER})"}
    outcomes = [
        run_case(case, tmp_path / "case.pkb", store, refs, device_for)
        for case in cases(seed.read_bytes(), SOURCE_CASES, SEED, kinds=("blob", "metadata"), formats=SOURCE_FORMATS)
    ]
    findings = [f"{o.case.kind} #{o.case.index} ({o.case.what}): {o.result}: {o.detail}" for o in outcomes if o.result not in ("refused", "ran")]
    assert not findings, "\n".join(findings)
    mutated = {o.case.what.split(" of ")[0] for o in outcomes if o.case.kind == "blob"}
    assert mutated == set(SOURCE_FORMATS)
    # mutated source stages reach the importer or compiler (in a worker) and are refused naming both releases
    unreadable = [o.detail for o in outcomes if o.case.kind == "blob" and "IncompatibleProducerError" in o.detail]
    assert unreadable and all(OTHER in d and installed_compiler().version in d for d in unreadable)
