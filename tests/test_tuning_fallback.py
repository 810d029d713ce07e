"""A stored tuning result is a suggestion: a config that does not build leaves the kernel on the
compiler's default, with one warning, and is marked so that it is not tried again."""

from __future__ import annotations

import warnings

import pytest

import portkern
from helpers import assert_matches
from portkern.cache.store import UNUSABLE, CacheWarning
from portkern.examples.reference import EXAMPLES
from portkern.jit import devices
from portkern.jit.loader import compiler_id, selection_problem
from portkern.tuner import perfconfig
from portkern.tuner.cpu_config import CpuConfig

#: Vector ops over whole 64x512 slices: LLVMCPU refuses to compile them.
DOES_NOT_BUILD = "0=" + perfconfig.to_string(CpuConfig((64, 64, 0), (0, 0, 0), (0, 0, 0)))


def plant(store, bundle, name: str, config: str) -> tuple:
    """Store a selection for `name` on this CPU, as an import or the remote tier would."""
    record, target = bundle.record(name), devices.resolve("cpu", store)
    problem = selection_problem(record, target)
    store.put_tuning(problem, target.fingerprint, compiler_id(record), {"kind": "kernel", "config": config, "strategy": "full"})
    return problem, target, compiler_id(record)


@pytest.mark.parametrize("tune", [None, "quick"])
def test_a_stored_config_that_does_not_build_falls_back_to_the_default(examples_bundle, store, rng, tune):
    bundle = portkern.load(examples_bundle, store=store)
    problem, target, compiler = plant(store, bundle, "gemm_bias_relu", DOES_NOT_BUILD)
    with pytest.warns(CacheWarning, match="does not build .* using the compiler's default") as caught:
        kernel = bundle.kernel("gemm_bias_relu", tune=tune)
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    assert kernel.config == "default"
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(rng)
    assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)

    stored = store.get_tuning(problem, target.fingerprint, compiler)
    assert stored["config"] == DOES_NOT_BUILD and stored[UNUSABLE]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # marked: not tried (nor warned about) again
        again = bundle.kernel("gemm_bias_relu")
    assert again.config == "default" and again.origin == "cache"


def test_a_stored_config_that_does_not_parse_falls_back_too(examples_bundle, store):
    bundle = portkern.load(examples_bundle, store=store)
    plant(store, bundle, "gemm_rowsum", "0=cpu:v9:1x1x1")
    with pytest.warns(CacheWarning, match="does not build"):
        assert bundle.kernel("gemm_rowsum").config == "default"


def test_a_stored_module_option_on_a_bundle_without_source_falls_back_to_the_default(store, rng, tmp_path):
    """`data-tiling` builds from the source stage; a `--no-source` bundle of the same kernel has none."""
    from portkern.examples import MANIFEST
    from portkern.portable.builder import build_file

    built = tmp_path / "no-source.pkb"
    build_file(MANIFEST, built, source=False)
    bundle = portkern.load(built, store=store)
    plant(store, bundle, "gemm_bias_relu", "data-tiling")
    with pytest.warns(CacheWarning, match="does not build .*no-source"):
        kernel = bundle.kernel("gemm_bias_relu")
    assert kernel.config == "default"
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(rng)
    assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)
