"""A stored tuning result is a suggestion: a config that does not build leaves the kernel on the
compiler's default, with one logged warning, and is marked so that it is not tried again."""

from __future__ import annotations

import pytest
from helpers import assert_example, logged

import portkern
from portkern.cache.store import UNUSABLE
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
def test_a_stored_config_that_does_not_build_falls_back_to_the_default(examples_bundle, store, rng, caplog, tune):
    bundle = portkern.load(examples_bundle, store=store)
    problem, target, compiler = plant(store, bundle, "gemm_bias_relu", DOES_NOT_BUILD)
    kernel = bundle.kernel("gemm_bias_relu", tune=tune)
    assert len(logged(caplog, "does not build .* using the compiler's default")) == 1
    assert kernel.config == "default"
    assert_example(kernel, rng, "gemm_bias_relu")

    stored = store.get_tuning(problem, target.fingerprint, compiler)
    assert stored["config"] == DOES_NOT_BUILD and stored[UNUSABLE]
    caplog.clear()
    again = bundle.kernel("gemm_bias_relu")
    assert not logged(caplog, "does not build")  # marked: not tried (nor logged) again
    assert again.config == "default" and again.origin == "cache"


def test_a_stored_config_that_does_not_parse_falls_back_too(examples_bundle, store, caplog):
    bundle = portkern.load(examples_bundle, store=store)
    plant(store, bundle, "gemm_rowsum", "0=cpu:v9:1x1x1")
    assert bundle.kernel("gemm_rowsum").config == "default"
    assert logged(caplog, "does not build")


def test_a_stored_module_option_on_a_bundle_without_source_falls_back_to_the_default(store, rng, tmp_path, caplog):
    """`data-tiling` builds from the source stage; a `--no-source` bundle of the same kernel has none."""
    from portkern.examples import MANIFEST
    from portkern.portable.builder import build_file

    built = tmp_path / "no-source.pkb"
    build_file(MANIFEST, built, source=False)
    bundle = portkern.load(built, store=store)
    plant(store, bundle, "gemm_bias_relu", "data-tiling")
    kernel = bundle.kernel("gemm_bias_relu")
    assert logged(caplog, "does not build .*no-source")
    assert kernel.config == "default"
    assert_example(kernel, rng, "gemm_bias_relu")
