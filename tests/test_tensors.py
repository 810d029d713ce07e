"""Framework tensors in and out (DLPack): torch CPU tensors without copies, typed errors otherwise."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch tensors need the 'torch' package (pip install 'portkern[torch]')")

import portkern  # noqa: E402
from portkern.errors import ArgumentShapeError, ArgumentTypeError  # noqa: E402
from portkern.examples.reference import EXAMPLES  # noqa: E402
from portkern.jit.args import check_arguments  # noqa: E402

NAME = "gemm_bias_relu"


@pytest.fixture(scope="module")
def kernel(examples_bundle, tmp_path_factory):
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store

    store = Store(CacheConfig(tmp_path_factory.mktemp("cache") / "v1", 1 << 30, False))
    return portkern.load(examples_bundle, store=store).kernel(NAME)


def example_inputs(seed: int = 0) -> list[np.ndarray]:
    return EXAMPLES[NAME].inputs(np.random.default_rng(seed))


def test_torch_tensors_in_torch_tensors_out_matching_numpy(kernel):
    arrays = example_inputs()
    out = kernel(*[torch.from_numpy(a) for a in arrays])
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    example = EXAMPLES[NAME]
    np.testing.assert_allclose(out.numpy(), example.reference(*arrays)[0], rtol=example.rtol, atol=example.atol)


def test_inputs_are_not_copied_and_outputs_share_portkern_result_memory(kernel, monkeypatch):
    tensors = [torch.from_numpy(a) for a in example_inputs(1)]
    viewed = check_arguments(NAME, kernel.signature, tensors)
    assert [v.ctypes.data for v in viewed] == [t.data_ptr() for t in tensors]  # the same memory, not a copy
    native, executable = kernel._code
    seen: list[np.ndarray] = []

    def spy(*arrays):
        assert [a.ctypes.data for a in arrays] == [t.data_ptr() for t in tensors]
        results = executable(*arrays)
        seen.extend(results)
        return results

    monkeypatch.setattr(kernel, "_code", (native, spy))
    out = kernel(*tensors)
    assert out.data_ptr() == seen[0].ctypes.data  # the tensor is portkern's result array, not a copy


def test_mixed_numpy_and_torch_inputs_give_numpy(kernel):
    a, b, c = example_inputs(2)
    out = kernel(torch.from_numpy(a), b, c)
    assert isinstance(out, np.ndarray)


def test_non_contiguous_tensors_are_copied_like_arrays(kernel):
    arrays = example_inputs(3)
    first = torch.from_numpy(np.ascontiguousarray(arrays[0].T)).T  # same values, transposed strides
    assert not first.is_contiguous()
    out = kernel(first, *[torch.from_numpy(a) for a in arrays[1:]])
    example = EXAMPLES[NAME]
    np.testing.assert_allclose(out.numpy(), example.reference(*arrays)[0], rtol=example.rtol, atol=example.atol)


def test_wrong_dtype_shape_grad_and_device_are_typed_errors(kernel):
    a, b, c = (torch.from_numpy(x) for x in example_inputs(4))
    with pytest.raises(ArgumentTypeError, match="argument 0 must have dtype float32, got float64"):
        kernel(a.double(), b, c)
    with pytest.raises(ArgumentShapeError, match="argument 1 must have shape"):
        kernel(a, b[:-1], c)
    with pytest.raises(ArgumentTypeError, match=r"argument 2 is a torch.Tensor that requires grad; pass tensor.detach\(\)"):
        kernel(a, b, c.clone().requires_grad_(True))
    meta = torch.empty(a.shape, dtype=torch.float32, device="meta")
    with pytest.raises(ArgumentTypeError, match="argument 0"):
        kernel(meta, b, c)
