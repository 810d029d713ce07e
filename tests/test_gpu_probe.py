"""GPU probing on machines without the GPU stack: a reason, never an exception."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import expected_skip

from portkern.base.errors import DeviceError
from portkern.cli.main import main
from portkern.jit import amdgpu, cuda
from portkern.jit.devices import probe_all, resolve
from portkern.jit.gpu import driver_problem


def _rocm_loadable() -> bool:
    try:
        from hip import hip
    except ImportError:
        return False
    return bool(hip.has_symbol("hipGetDeviceCount"))


@pytest.mark.skipif(_rocm_loadable(), reason=expected_skip("device", "the HIP runtime is installed here"))
def test_amd_probe_without_rocm_reports_the_reason():
    pytest.importorskip("hip", reason="hip-python (portkern[amd]) is not installed")
    probe = amdgpu.probe()
    assert probe.devices == () and probe.kind == "amdgpu"
    assert probe.reason.startswith("no ROCm: the HIP runtime library libamdhip64.so is not loadable")
    assert "not usable" in driver_problem("hip") and "libamdhip64.so" in driver_problem("hip")


DEBIAN_HIP = Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5")


@pytest.mark.skipif(not DEBIAN_HIP.exists(), reason="needs Debian's ROCm HIP runtime (apt install libamdhip64-5)")
def test_amd_probe_with_a_hip_runtime_but_no_gpu(tmp_path):
    """hip-python finds a real (old) HIP runtime through ROCM_PATH; it reports no device."""
    pytest.importorskip("hip", reason="hip-python (portkern[amd]) is not installed")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libamdhip64.so").symlink_to(DEBIAN_HIP)
    code = "from portkern.jit import amdgpu; import json; p = amdgpu.probe(); print(json.dumps([len(p.devices), p.reason]))"
    env = dict(os.environ, ROCM_PATH=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, reason = json.loads(done.stdout)
    assert count == 0 and reason == "no AMD device: hipGetDeviceCount returned hipErrorNoDevice"


def _cuda_loadable() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_cuda_loadable(), reason=expected_skip("device", "an NVIDIA driver is installed here"))
def test_cuda_probe_without_driver_reports_the_reason():
    probe = cuda.probe()
    assert probe.devices == () and probe.reason == "no NVIDIA driver: libcuda.so.1 is not loadable"
    assert "CUDA driver library" in driver_problem("cuda")


@pytest.mark.skipif(bool(amdgpu.probe().devices), reason=expected_skip("device", "this machine has an AMD GPU"))
def test_named_amd_target_without_device_is_not_runnable_but_usable_for_finalising(store):
    with pytest.raises(DeviceError, match=re.escape(f"no AMD GPU here: {amdgpu.probe().reason}")):
        resolve("amdgpu", store)
    target = resolve("gfx942", store)
    assert not target.runnable and amdgpu.probe().reason in target.reason
    assert target.family == "amdgpu" and target.driver == "hip" and target.flags == ()
    assert 'arch = "gfx942"' in target.executable_target
    assert list(store.records("p"))  # the resolved target attribute is memoised


def test_devices_command_lists_every_gpu_kind(capsys):
    assert main(["devices", "--json"]) == 0
    found = {entry["kind"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert {"cpu", "amdgpu", "cuda"} <= set(found)
    for kind in ("amdgpu", "cuda"):
        entry = found[kind]
        assert entry["found"] == bool(entry["devices"])
        assert entry["found"] or entry["reason"]  # what was not found says why (no driver, no device, no binding)
    assert [p.kind for p in probe_all()][:3] == ["cpu", "amdgpu", "cuda"]
