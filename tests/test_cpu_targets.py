"""The bundle is CPU-independent; the loader detects the CPU and finalises for it."""

from __future__ import annotations

import re

import pytest
from helpers import assert_example, assert_matches, expected_skip

import portkern
from portkern.base.errors import DeviceError
from portkern.examples.reference import EXAMPLES
from portkern.jit import cpu
from portkern.jit.devices import resolve
from portkern.jit.finalize import finalize
from portkern.portable.bundle import read_bundle
from portkern.portable.compiler import Compiler


def test_bundle_stage_has_no_target(examples_bundle):
    bundle = read_bundle(examples_bundle)
    for record in bundle.kernels:
        text = str(Compiler().parse(bundle.blob(record.stage().blob)))
        assert "flow.executable" in text
        assert "hal.executable.target" not in text and "hal.device.target" not in text


def test_host_cpu_is_identified_without_llvm_and_llvm_agrees(store):
    """The caller reads the CPU from the OS; LLVM's view of it (asked in a child process) is
    code this host runs and that uses every feature the OS reported."""
    detected = cpu.host(store)
    assert detected.arch == cpu.HOST and "+sse2" in detected.features.split(",")
    assert not list(store.records("p"))  # no LLVM probe was needed
    llvm = cpu.llvm_host(store)
    assert llvm.arch not in ("", "host", "generic")
    assert cpu.can_run(llvm, detected) and not cpu.is_baseline(llvm, detected)
    assert cpu.llvm_host(store) == llvm and list(store.records("p"))  # memoised in the store
    assert "--iree-llvmcpu-target-cpu=host" in cpu.flags(detected)


def test_same_bundle_finalises_for_two_cpu_models(examples_bundle, store, rng):
    """Simulates a machine of another CPU model: code for haswell runs on this (newer) host."""
    bundle = read_bundle(examples_bundle)
    record = bundle.kernel("gemm_bias_relu")
    host, other = resolve("cpu", store), resolve("cpu:haswell", store)
    assert other.fingerprint.arch == "haswell" and "--iree-llvmcpu-target-cpu=haswell" in other.flags
    assert host.fingerprint != other.fingerprint and other.runnable
    assert finalize(bundle, record, host) != finalize(bundle, record, other)

    loaded = portkern.load(examples_bundle, store=store)
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(rng)
    for device in ("cpu", "cpu:haswell"):
        kernel = loaded.kernel("gemm_bias_relu", device=device)
        assert kernel.device == resolve(device, store).label
        assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)
    keys = {e.device_label for e in store.entries()}
    assert keys == {host.label, "cpu:haswell"}


def test_loader_finalises_for_whatever_cpu_it_detects(examples_bundle, store, monkeypatch, rng):
    """If detection reports another CPU model, the code and the cache key follow it."""
    haswell = cpu.resolve("haswell", store)
    monkeypatch.setattr(cpu, "host", lambda store=None: haswell)
    kernel = portkern.load(examples_bundle, store=store).kernel("gemm_rowsum")
    assert kernel.device == "cpu:haswell"
    assert "--iree-llvmcpu-target-cpu=haswell" in kernel.target.flags
    assert_example(kernel, rng, "gemm_rowsum")


def test_cpu_with_features_this_host_lacks_is_not_run(examples_bundle, store):
    host = cpu.host(store)
    # A CPU whose default features are not all on this host (AMX on Intel server parts, or AVX-512 on older hosts).
    candidates = ["graniterapids", "sapphirerapids", "znver5", "skylake-avx512"]
    foreign = next((c for c in candidates if not cpu.can_run(cpu.resolve(c, store), host)), None)
    if foreign is None:
        pytest.skip(expected_skip("cpu", "this host has every feature of the candidate CPUs"))
    target = resolve(f"cpu:{foreign}", store)
    assert not target.runnable and "lacks CPU features" in target.reason
    with pytest.raises(DeviceError, match=re.escape(f"cannot run 'gemm_glu' on cpu:{foreign} here")):
        portkern.load(examples_bundle, store=store).kernel("gemm_glu", device=f"cpu:{foreign}")


def test_unknown_cpu_and_device_names(store):
    with pytest.raises(DeviceError, match="LLVM does not know the CPU 'pentium9000'"):
        resolve("cpu:pentium9000", store)
    with pytest.raises(DeviceError, match="unknown device kind 'tpu'"):
        resolve("tpu", store)
