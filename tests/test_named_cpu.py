"""Native code built for a named CPU is served on a host whose CPU has every feature it uses."""

from __future__ import annotations

import platform

import pytest
from helpers import assert_example, cli_json, expected_skip, prebuilt_example

import portkern
from portkern.jit import cpu

#: A baseline every x86-64 host of the last decade runs, and CPUs with features hosts often lack.
SUBSET = "x86-64-v2"
SUPERSETS = ("graniterapids", "sapphirerapids", "znver5", "znver4")

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason=expected_skip("cpu", "x86-64 CPU names"))


def lacking() -> str:
    """A CPU name whose code this host cannot run."""
    here = cpu.host()
    name = next((n for n in SUPERSETS if not cpu.can_run(cpu.resolve(n), here)), None)
    if name is None:
        pytest.skip(expected_skip("cpu", f"this host runs code for every one of {SUPERSETS}"))
    return name


@pytest.fixture(scope="module")
def fat(tmp_path_factory):
    """A one-kernel bundle prebuilt for a baseline CPU and for one this host lacks features of."""
    if not cpu.can_run(cpu.resolve(SUBSET), cpu.host()):
        pytest.skip(expected_skip("cpu", f"this host cannot run {SUBSET} code"))
    return prebuilt_example(tmp_path_factory.mktemp("named"), "fat", [f"cpu:{SUBSET}", f"cpu:{lacking()}"])


def test_named_cpu_prebuild_is_served_on_a_host_with_its_features(fat, store, rng):
    kernel = portkern.load(fat, store=store).kernel("gemm_bias_relu")
    assert kernel.origin == "baseline" and kernel.native.built_for == f"cpu:{SUBSET}"
    assert_example(kernel, rng)
    again = portkern.load(fat, store=store).kernel("gemm_bias_relu")  # later: from the cache
    assert again.origin in ("baseline", "cache") and again.native.built_for in (f"cpu:{SUBSET}", cpu.host(store).label)
    assert kernel.wait() and again.wait()
    exact = portkern.load(fat, store=store).kernel("gemm_bias_relu")  # the exact code the background built
    assert exact.origin == "cache" and exact.native.built_for == cpu.host(store).label


def test_code_for_a_cpu_with_features_this_host_lacks_is_refused(fat, store):
    loaded = portkern.load(fat, store=store)
    record = loaded.record("gemm_bias_relu")
    named = {n.target for n in record.native}
    assert named == {f"cpu:{SUBSET}", f"cpu:{lacking()}"}
    here = cpu.host(store)
    served = [fp.arch for fp in cpu.serving_order(here, [cpu.resolve(t.split(":")[1]) for t in named])]
    assert served == [SUBSET]
    with pytest.raises(portkern.DeviceError, match="lacks CPU features"):
        loaded.kernel("gemm_bias_relu", device=f"cpu:{lacking()}")


def test_exact_host_build_is_preferred(tmp_path, store, capsys):
    out = prebuilt_example(tmp_path, "both", [f"cpu:{SUBSET}", "cpu"])
    capsys.readouterr()
    kernel = portkern.load(out, store=store).kernel("gemm_bias_relu")
    assert kernel.origin == "prebuilt" and kernel.native.built_for == cpu.host(store).label


def test_named_cpu_cache_entry_is_served(examples_bundle, tmp_path, capsys):
    """`finalize --target cpu:NAME` into a cache (as a fleet import would fill it) serves this host."""
    cache = str(tmp_path / "cache")
    status, done = cli_json(capsys, "finalize", str(examples_bundle), "--target", f"cpu:{SUBSET}", "--kernel", "mlp", "--cache-dir", cache)
    assert status == 0
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store

    store = Store(CacheConfig(tmp_path / "cache" / "v1", 1 << 30, False))
    kernel = portkern.load(examples_bundle, store=store).kernel("mlp")
    assert kernel.origin == "baseline" and kernel.native.key == done["entries"][0]["key"]
    assert kernel.wait() and kernel.origin == "finalized"


def test_inspect_and_cache_ls_say_which_hosts_an_artefact_serves(fat, tmp_path, capsys):
    status, shown = cli_json(capsys, "inspect", str(fat))
    serves = {n["target"]: n["serves"] for n in shown["kernels"][0]["native"]}
    assert serves[f"cpu:{SUBSET}"].endswith("; this host") and serves[f"cpu:{lacking()}"].endswith("; not this host")
    cache = str(tmp_path / "cache")
    assert cli_json(capsys, "finalize", fat, "--target", f"cpu:{SUBSET}", "--cache-dir", cache)[0] == 0
    status, listed = cli_json(capsys, "cache", "ls", "--cache-dir", cache)
    assert [e["serves"] for e in listed] == [serves[f"cpu:{SUBSET}"]]


def test_a_prebuild_for_this_cpus_own_model_is_served_as_its_code(tmp_path, store, rng):
    """`--prebuild cpu:NAME` with LLVM's name for this CPU is this host's code, though a VM may
    hide system features (`cpu.SYSTEM_FEATURES`) that LLVM lists for NAME."""
    name = cpu.llvm_host(store).arch
    out = prebuilt_example(tmp_path, "own", [f"cpu:{name}"])
    kernel = portkern.load(out, store=store).kernel("gemm_bias_relu")
    assert kernel.origin == "prebuilt" and kernel.native.built_for == f"cpu:{name}"
    assert kernel.specialisation is None  # nothing better to build in the background
    assert_example(kernel, rng)
