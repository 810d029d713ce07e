"""Ahead-of-time native code: `portkern finalize --target` into the cache, and
`portkern build --prebuild` into the bundle, each served only to its exact fingerprint."""

from __future__ import annotations

import dataclasses

from helpers import assert_example, cli_json, logged

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.cli.main import main
from portkern.jit import codeobject
from portkern.jit.devices import resolve
from portkern.jit.loader import LoadedBundle
from portkern.portable.bundle import NativeArtifact, read_bundle, sha256


def test_cross_finalised_entries_are_served_only_to_the_same_fingerprint(gpu_bundle, tmp_path, capsys):
    cache = tmp_path / "cache"
    status, report = cli_json(capsys, "finalize", str(gpu_bundle), "--target", "gfx942", "--cache-dir", str(cache))
    assert status == 0
    (entry,) = report["entries"]
    assert entry["ok"] and entry["origin"] == "finalized" and entry["target"] == "amdgpu:gfx942"
    assert entry["code"].startswith("HSACO gfx942 (amdgpu9.42-amd-amdhsa-unknown-gfx942")

    store = Store(CacheConfig(cache / "v1", 1 << 30, False))
    loaded = portkern.load(gpu_bundle, store=store)
    record = loaded.record("gemm_bias_relu")
    served = loaded.native(record, resolve("amdgpu:gfx942", store))
    assert served.origin == "cache" and served.key == entry["key"]
    assert codeobject.inspect(served.data).archs == ("gfx942",)
    for other in ("gfx90a", "gfx942:xnack-", "gfx942:sramecc+:xnack-", "cuda:sm_90", "cpu"):
        assert store.get(loaded.key(record, resolve(other, store)).hex) is None, other
    fresh = loaded.native(record, resolve("gfx1100", store))
    assert fresh.origin == "finalized" and codeobject.inspect(fresh.data).archs == ("gfx1100",)
    assert {e.device_label for e in store.entries()} == {"amdgpu:gfx942", "amdgpu:gfx1100"}


def test_cached_code_for_another_arch_is_evicted_and_rebuilt(gpu_bundle, gpu_native, store, caplog):
    loaded = portkern.load(gpu_bundle, store=store)
    record = loaded.record("gemm_bias_relu")
    target = resolve("gfx1100", store)
    plan = loaded.plan(record, target)
    store.put(plan.hex, gpu_native("gfx942"), loaded.natives.entry(plan, loaded.natives.obtain(plan)))
    native = loaded.native(record, target)
    assert logged(caplog, "is not code for amdgpu:gfx1100 .*code object for gfx942")
    assert native.origin == "finalized" and codeobject.inspect(native.data).archs == ("gfx1100",)


def test_cross_finalise_for_a_named_cpu_runs_here(examples_bundle, tmp_path, capsys, rng):
    cache = tmp_path / "cache"
    status, report = cli_json(
        capsys, "finalize", str(examples_bundle), "--target", "cpu:haswell", "--kernel", "gemm_glu", "--cache-dir", str(cache)
    )
    assert status == 0 and [(e["kernel"], e["origin"]) for e in report["entries"]] == [("gemm_glu", "finalized")]
    kernel = portkern.load(examples_bundle, store=Store(CacheConfig(cache / "v1", 1 << 30, False))).kernel(
        "gemm_glu", device="cpu:haswell"
    )
    assert kernel.origin == "cache"
    assert_example(kernel, rng, "gemm_glu")


def test_finalize_reports_bad_targets_in_one_line(gpu_bundle, capsys):
    assert main(["finalize", str(gpu_bundle), "--target", "gfx942,hopper"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("portkern: error: ") and "\n" not in err and "unknown device kind 'hopper'" in err


def test_export_needs_the_cache_transfer_module(gpu_bundle, tmp_path, capsys):
    try:
        from portkern.cache import transfer
    except ImportError:
        transfer = None
    out = tmp_path / "warm.export"
    argv = ["finalize", str(gpu_bundle), "--target", "cuda:sm_90", "--cache-dir", str(tmp_path / "a"), "--export", str(out)]
    if transfer is None:
        assert main(argv) == 1
        assert "--export needs portkern.cache.transfer" in capsys.readouterr().err
        return
    status, report = cli_json(capsys, *argv)
    assert status == 0 and report["exported"]["path"] == str(out) and report["exported"]["entries"] == 1
    fleet = Store(CacheConfig(tmp_path / "b" / "v1", 1 << 30, False))
    imported = transfer.import_(fleet, out, allow_unsigned=True)
    assert imported.entries == 1 and imported.rejected == []
    (entry,) = report["entries"]
    loaded = portkern.load(gpu_bundle, store=fleet)
    served = loaded.native(loaded.record("gemm_bias_relu"), resolve("cuda:sm_90", fleet))
    assert served.origin == "cache" and served.key == entry["key"]
    assert {(p.version, p.target) for p in codeobject.inspect(served.data).ptx} == {("7.8", "sm_90")}


def test_prebuilt_native_code_is_used_on_an_exact_match(gpu_bundle, tmp_path, capsys, store, rng):
    out = tmp_path / "fat.pkb"
    status, built = cli_json(
        capsys, "build", str(gpu_bundle.parent / "manifest.yaml"), "-o", str(out), "--prebuild", "gfx942,cpu:haswell"
    )
    assert status == 0
    (kernel,) = built["kernels"]
    assert [n["target"] for n in kernel["native"]] == ["amdgpu:gfx942", "cpu:haswell"]
    assert kernel["native"][0]["device"] == {"kind": "amdgpu", "arch": "gfx942", "features": "", "properties": {}}
    status, shown = cli_json(capsys, "inspect", str(out))
    assert shown["kernels"][0]["native"] == kernel["native"]

    loaded = portkern.load(out, store=store)
    record = loaded.record("gemm_bias_relu")
    prebuilt = loaded.native(record, resolve("gfx942", store))
    assert prebuilt.origin == "prebuilt" and prebuilt.data == loaded.bundle.blob(record.native[0].blob)
    assert loaded.native(record, resolve("gfx942", store)).origin == "cache"
    assert loaded.native(record, resolve("gfx1100", store)).origin == "finalized"

    cpu_kernel = loaded.kernel("gemm_bias_relu", device="cpu:haswell")
    assert cpu_kernel.origin == "prebuilt"
    assert_example(cpu_kernel, rng, "gemm_bias_relu")


def test_prebuilt_slice_with_wrong_code_is_ignored(gpu_bundle, gpu_native, store, caplog):
    bundle = read_bundle(gpu_bundle)
    wrong = gpu_native("gfx1100")
    target = resolve("gfx942", store)
    record = dataclasses.replace(
        bundle.kernel("gemm_bias_relu"),
        native=(NativeArtifact(target.label, "vmfb", sha256(wrong), len(wrong), target.fingerprint.to_dict()),),
    )
    tampered = dataclasses.replace(bundle, kernels=(record,), blobs={**bundle.blobs, sha256(wrong): wrong})
    loaded = LoadedBundle(tampered, gpu_bundle, store)
    native = loaded.native(record, target)
    assert logged(caplog, "prebuilt amdgpu:gfx942 code of 'gemm_bias_relu' ignored: code object for gfx1100")
    assert native.origin == "finalized" and codeobject.inspect(native.data).archs == ("gfx942",)
