"""Assertions shared by the kernel tests."""

from __future__ import annotations

import numpy as np


def assert_matches(outputs, references, rtol: float, atol: float) -> None:
    """Every output equals its NumPy reference within rtol/atol."""
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert len(outputs) == len(references)
    for got, want in zip(outputs, references):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def opencl_toolchain_missing() -> str:
    """Why OpenCL C cannot be built here ("" when it can)."""
    from portkern.portable.opencl import APT_HINT, missing_tools

    missing = missing_tools("opencl")
    return f"needs {', '.join(missing)} ({APT_HINT})" if missing else ""


def opencl_device_missing() -> str:
    """Why no OpenCL device can run kernels here ("" when one can)."""
    from portkern.jit import opencl

    probe = opencl.probe()
    return "" if probe.devices else f"needs an OpenCL device: {probe.reason}"
