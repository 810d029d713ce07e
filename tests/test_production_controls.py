"""Production controls: `portkern check` names each kernel that would compile on a device here;
`PORTKERN_COMPILE=never` turns a would-be compile into a `CompileForbiddenError` naming the kernel
and the device, while cached and prebuilt code still serve."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ADD_AND_SCALE, assert_matches, build_mlir, cli_json

import portkern
from portkern.base import settings
from portkern.base.errors import CompileForbiddenError
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.cli.main import main
from portkern.jit import devices

KERNELS = list(ADD_AND_SCALE)


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory):
    return build_mlir(tmp_path_factory.mktemp("controls"), "controls", **ADD_AND_SCALE)


def store_at(directory) -> Store:
    return Store(CacheConfig(directory / "v1", 1 << 30, False))


def check_json(capsys, bundle, cache_dir) -> tuple[int, dict]:
    return cli_json(capsys, "check", bundle, "--cache-dir", cache_dir)


def assert_add_runs(bundle, rng, expected_origin: str) -> None:
    kernel = bundle.kernel("add")
    assert kernel.origin == expected_origin
    a, b = rng.standard_normal((4, 8), dtype=np.float32), rng.standard_normal((4, 8), dtype=np.float32)
    assert_matches(kernel(a, b), (a + b,), rtol=1e-6, atol=1e-6)


def test_check_names_each_kernel_that_would_compile_until_finalized(bundle_path, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(settings.COMPILE, raising=False)
    cache_dir = tmp_path / "cache"
    assert main(["check", str(bundle_path), "--cache-dir", str(cache_dir)]) == 1
    out = capsys.readouterr().out
    assert "2 kernel(s) would compile on" in out and "add, scale" in out

    status, report = check_json(capsys, bundle_path, cache_dir)
    label = devices.resolve("cpu", store_at(cache_dir)).label
    assert status == 1 and report["json_format"] == 1 and report["ok"] is False and report["device"] == label
    assert report["would_compile"] == KERNELS and report["errors"] == []
    assert [(k["kernel"], k["state"], k["ready"]) for k in report["kernels"]] == [(n, "would compile", False) for n in KERNELS]
    assert store_at(cache_dir).entries() == []  # check compiled nothing

    assert main(["finalize", str(bundle_path), "--target", "cpu", "--cache-dir", str(cache_dir), "--json"]) == 0
    capsys.readouterr()
    status, report = check_json(capsys, bundle_path, cache_dir)
    assert status == 0 and report["ok"] is True and report["would_compile"] == []
    assert [(k["kernel"], k["state"], k["origin"]) for k in report["kernels"]] == [(n, "ready", "cache") for n in KERNELS]
    assert main(["check", str(bundle_path), "--cache-dir", str(cache_dir)]) == 0
    assert "ready: every kernel has native code for" in capsys.readouterr().out


def test_compile_never_refuses_a_cold_kernel_and_serves_finalized_code(bundle_path, tmp_path, capsys, monkeypatch, rng):
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv(settings.COMPILE, "never")
    bundle = portkern.load(bundle_path, store=store_at(cache_dir))
    label = devices.resolve("cpu", bundle.store).label
    with pytest.raises(CompileForbiddenError, match=rf"'add' has no native code for {label}.*PORTKERN_COMPILE=never"):
        bundle.kernel("add")
    assert store_at(cache_dir).entries() == []
    status, report = cli_json(capsys, "run", bundle_path, "scale", "--cache-dir", cache_dir)
    assert status == 1 and report["error"] == "CompileForbiddenError"

    monkeypatch.setenv(settings.COMPILE, "auto")
    assert main(["finalize", str(bundle_path), "--target", "cpu", "--kernel", "add", "--cache-dir", str(cache_dir), "--json"]) == 0
    capsys.readouterr()
    monkeypatch.setenv(settings.COMPILE, "NEVER")
    bundle = portkern.load(bundle_path, store=store_at(cache_dir))
    assert_add_runs(bundle, rng, "cache")
    with pytest.raises(CompileForbiddenError, match="'scale'"):
        bundle.kernel("scale")


def test_compile_never_serves_prebuilt_code(bundle_path, tmp_path, capsys, monkeypatch, rng):
    monkeypatch.delenv(settings.COMPILE, raising=False)
    prebuilt = tmp_path / "prebuilt.pkb"
    assert main(["build", str(bundle_path.with_suffix(".yaml")), "-o", str(prebuilt), "--prebuild", "cpu", "--json"]) == 0
    capsys.readouterr()
    cache_dir = tmp_path / "fresh"
    status, report = check_json(capsys, prebuilt, cache_dir)
    assert status == 0 and [k["origin"] for k in report["kernels"]] == ["prebuilt", "prebuilt"]
    monkeypatch.setenv(settings.COMPILE, "never")
    assert_add_runs(portkern.load(prebuilt, store=store_at(tmp_path / "other")), rng, "prebuilt")



def test_compile_never_leaves_a_stored_tuning_config_usable(examples_bundle, store, monkeypatch, rng):
    """A stored config whose code is not here is refused under never, and not marked unusable:
    the refusal is a policy, not a config that fails to build."""
    from portkern.cache.store import UNUSABLE
    from portkern.jit.loader import compiler_id, selection_problem
    from portkern.tuner import perfconfig
    from portkern.tuner.cpu_config import CpuConfig

    bundle = portkern.load(examples_bundle, store=store)
    bundle.kernel("gemm_bias_relu")  # the default config's code, cached
    record, target = bundle.record("gemm_bias_relu"), devices.resolve("cpu", store)
    problem, compiler = selection_problem(record, target), compiler_id(record)
    config = "0=" + perfconfig.to_string(CpuConfig((32, 32, 0), (8, 16, 0), (0, 0, 4)))
    store.put_tuning(problem, target.fingerprint, compiler, {"kind": "kernel", "config": config, "strategy": "full"})
    monkeypatch.setenv(settings.COMPILE, "never")
    with pytest.raises(CompileForbiddenError, match=r"'gemm_bias_relu' has no native code for .* \(config '0=cpu:"):
        portkern.load(examples_bundle, store=store).kernel("gemm_bias_relu")
    assert UNUSABLE not in store.get_tuning(problem, target.fingerprint, compiler)


def test_compile_never_refuses_a_tuning_search_before_any_compile(examples_bundle, tmp_path, monkeypatch):
    """`kernel(tune=...)` with nothing stored would compile candidates: refused, nothing built."""
    monkeypatch.setenv(settings.COMPILE, "never")
    store = store_at(tmp_path / "cache")
    bundle = portkern.load(examples_bundle, store=store)
    with pytest.raises(CompileForbiddenError, match=r"'gemm_bias_relu' on .*tune='quick'.*PORTKERN_COMPILE=never"):
        bundle.kernel("gemm_bias_relu", tune="quick")
    assert store.entries() == []
