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
