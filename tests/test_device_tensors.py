"""torch tensors in GPU memory as arguments and results of GPU kernels (DLPack, no copies to the host),
and host arrays through the buffers a GPU kernel keeps: results checked against NumPy, and the typed
errors for what cannot be taken in place. Needs an
NVIDIA GPU and torch built with CUDA; elsewhere every test here is skipped (declared)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import expected_skip

import portkern
from portkern.base.errors import ArgumentShapeError, ArgumentTypeError
from portkern.examples.reference import EXAMPLES
from portkern.jit import cuda

torch = pytest.importorskip("torch", reason=expected_skip("torch", "torch tensors need the 'torch' package (pip install 'portkern[torch]'; ./dev.sh torch)"))
pytestmark = pytest.mark.skipif(
    not (cuda.probe().devices and torch.cuda.is_available()),
    reason=expected_skip("device", "needs an NVIDIA GPU that both IREE and torch see"),
)

NAME = "gemm_bias_relu"
EXAMPLE = EXAMPLES[NAME]


@pytest.fixture(scope="module")
def kernel(examples_bundle):
    return portkern.load(examples_bundle).kernel(NAME, device="cuda")


def host_inputs(seed: int) -> list[np.ndarray]:
    return EXAMPLE.inputs(np.random.default_rng(seed))


def assert_reference(out, arrays: list[np.ndarray]) -> None:
    (reference,) = EXAMPLE.reference(*arrays)
    np.testing.assert_allclose(out.cpu().numpy(), reference, rtol=EXAMPLE.rtol, atol=EXAMPLE.atol)


def test_gpu_tensors_in_give_gpu_tensors_out_matching_numpy(kernel):
    arrays = host_inputs(0)
    tensors = [torch.from_numpy(a).cuda() for a in arrays]
    out = kernel(*tensors)
    assert isinstance(out, torch.Tensor) and out.device == tensors[0].device
    assert_reference(out, arrays)
    # the same kernel still takes host arrays and gives host arrays
    host = kernel(*arrays)
    assert type(host) is np.ndarray
    np.testing.assert_allclose(host, out.cpu().numpy(), rtol=EXAMPLE.rtol, atol=EXAMPLE.atol)


def test_arguments_still_being_computed_by_torch_are_read_finished(kernel):
    """An argument made by torch just before the call (queued on torch's stream) is read once written."""
    arrays = host_inputs(1)
    a, b, bias = (torch.from_numpy(x).cuda() for x in arrays)
    for _ in range(5):  # queue much work on torch's stream, the last of it writing the argument
        big = torch.randn(4096, 4096, device="cuda")
        big = big @ big
    a2 = (a * 3.0) / 3.0 + big[0, 0] * 0.0
    out = kernel(a2, b, bias)
    assert_reference(out, arrays)


def test_each_result_keeps_its_own_memory(kernel):
    first_arrays, second_arrays = host_inputs(2), host_inputs(3)
    first = kernel(*(torch.from_numpy(a).cuda() for a in first_arrays))
    second = kernel(*(torch.from_numpy(a).cuda() for a in second_arrays))
    torch.cuda.synchronize()
    assert_reference(first, first_arrays)
    assert_reference(second, second_arrays)


def test_what_cannot_be_taken_in_place_is_refused_with_a_typed_error(kernel):
    a, b, bias = (torch.from_numpy(x).cuda() for x in host_inputs(4))
    with pytest.raises(ArgumentTypeError, match="argument 2 is in host memory while others are on the GPU"):
        kernel(a, b, bias.cpu().numpy())
    with pytest.raises(ArgumentTypeError, match="argument 0 must have dtype float32"):
        kernel(a.double(), b, bias)
    with pytest.raises(ArgumentShapeError, match="argument 1 must have shape"):
        kernel(a, b[:-1], bias)
    with pytest.raises(ArgumentTypeError, match="requires grad; pass tensor.detach"):
        kernel(a.clone().requires_grad_(True), b, bias)
    transposed = a.t().contiguous().t()  # the same values, transposed strides
    with pytest.raises(ArgumentTypeError, match=r"not contiguous.*pass tensor.contiguous\(\)"):
        kernel(transposed, b, bias)


def test_host_arrays_on_the_gpu_match_numpy_call_after_call(kernel):
    """Host arrays go through buffers a GPU kernel keeps between calls: no result is overwritten by a later call."""
    kept = []
    for seed in (5, 6, 7):
        arrays = host_inputs(seed)
        out = kernel(*arrays)
        assert type(out) is np.ndarray
        kept.append((out, arrays))
    for out, arrays in kept:
        (reference,) = EXAMPLE.reference(*arrays)
        np.testing.assert_allclose(out, reference, rtol=EXAMPLE.rtol, atol=EXAMPLE.atol)
