"""Bad calls fail before anything runs, with TypeError/ValueError naming the argument."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import portkern
from portkern.base.errors import ArgumentShapeError, ArgumentTypeError, KernelNotFoundError


@pytest.fixture(scope="module")
def gemm(examples_bundle):
    return portkern.load(examples_bundle).kernel("gemm_bias_relu")


def args():
    return [np.zeros((256, 512), np.float32), np.zeros((512, 384), np.float32), np.zeros(384, np.float32)]


def test_wrong_argument_count(gemm):
    with pytest.raises(TypeError, match=r"gemm_bias_relu\(\) takes 3 arguments .* got 2"):
        gemm(*args()[:2])


def test_wrong_dtype_names_the_argument(gemm):
    a, b, bias = args()
    with pytest.raises(ArgumentTypeError, match=r"argument 1 must have dtype float32, got float64"):
        gemm(a, b.astype(np.float64), bias)


def test_wrong_shape_names_the_argument(gemm):
    a, b, bias = args()
    with pytest.raises(ValueError, match=r"argument 2 must have shape 384, got 385"):
        gemm(a, b, np.zeros(385, np.float32))
    with pytest.raises(ArgumentShapeError, match=r"argument 0 must have shape 256x512, got 512x256"):
        gemm(a.T.copy(), b, bias)


def test_not_an_array(gemm):
    a, b, _ = args()
    with pytest.raises(TypeError, match=r"argument 2 must be a numpy array of 384xfloat32, got list"):
        gemm(a, b, [0.0] * 384)


def test_non_contiguous_input_is_accepted_and_correct(gemm):
    a, b, bias = args()
    a = np.asfortranarray(np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32))
    b = np.eye(512, 384, dtype=np.float32)
    out = gemm(a, b, bias)
    np.testing.assert_allclose(out, np.maximum(a[:, :384], 0), rtol=1e-6, atol=1e-6)


def test_a_masked_array_is_refused_and_its_filled_values_are_used(gemm):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((512, 384)).astype(np.float32)
    bias = np.ma.masked_less(rng.standard_normal(384).astype(np.float32), 0)
    assert bias.mask.any()
    with pytest.raises(ArgumentTypeError, match=r"argument 2 is a NumPy masked array: .*mask.*\.filled\(value\).*\.data"):
        gemm(a, b, bias)
    filled = bias.filled(0)
    np.testing.assert_allclose(gemm(a, b, filled), np.maximum(a @ b + filled, 0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("given", [None, 3, b"examples.pkb"])
def test_load_takes_a_path_and_kernel_a_name(examples_bundle, given):
    with pytest.raises(ArgumentTypeError, match=rf"load\(\) takes a bundle's path \(str or os.PathLike\), got {type(given).__name__}"):
        portkern.load(given)
    with pytest.raises(ArgumentTypeError, match=rf"a kernel is named by a str, got {type(given).__name__}"):
        portkern.load(examples_bundle).kernel(given)


def test_a_kernel_or_a_bundle_to_pickle_says_what_to_do_instead(examples_bundle, gemm):
    """A process pool that starts its workers by `spawn` pickles what it is given: a typed error
    that says how to get the kernel in the other process, not a TypeError about an RLock."""
    with pytest.raises(ArgumentTypeError, match=r"a Kernel cannot be pickled .* portkern.load\(path\).kernel\('gemm_bias_relu', device='cpu:host'\) there"):
        pickle.dumps(gemm)
    with pytest.raises(ArgumentTypeError, match=r"a loaded bundle cannot be pickled .* call portkern.load\(path\) there"):
        pickle.dumps(portkern.load(examples_bundle))


def test_unknown_kernel(examples_bundle):
    with pytest.raises(KernelNotFoundError, match="has no kernel 'nope'"):
        portkern.load(examples_bundle).kernel("nope")
