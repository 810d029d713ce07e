"""Every example kernel, finalised for this CPU from the bundle, matches its NumPy reference."""

from __future__ import annotations

import pytest
from helpers import assert_matches

import portkern
from portkern.examples import MANIFEST
from portkern.examples.reference import EXAMPLES
from portkern.portable.manifest import load_manifest


@pytest.mark.parametrize("name", sorted(k.name for k in load_manifest(MANIFEST).kernels))
def test_example_matches_numpy(examples_bundle, store, rng, name):
    example = EXAMPLES[name]
    kernel = portkern.load(examples_bundle, store=store).kernel(name, device="cpu")
    assert kernel.origin == "finalized" and kernel.config == "default"
    for _ in range(2):  # two input draws: a kernel cannot pass by luck on one
        inputs = example.inputs(rng)
        assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)


def test_wrong_results_would_be_caught(examples_bundle, store, rng):
    """The stated tolerances are tight enough to fail a kernel that is off by 0.1%."""
    example = EXAMPLES["gemm_bias_relu"]
    kernel = portkern.load(examples_bundle, store=store).kernel("gemm_bias_relu")
    inputs = example.inputs(rng)
    with pytest.raises(AssertionError):
        assert_matches(kernel(*inputs) * 1.001, example.reference(*inputs), example.rtol, example.atol)
