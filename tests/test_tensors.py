"""Framework tensors in and out (DLPack): viewed without copies, torch results over portkern's
result memory, the same typed errors as arrays otherwise, and torch never imported by portkern."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import expected_skip

import portkern
from portkern.base.errors import ArgumentShapeError, ArgumentTypeError
from portkern.examples.reference import EXAMPLES
from portkern.jit.args import check_arguments

NAME = "gemm_bias_relu"
EXAMPLE = EXAMPLES[NAME]
NEEDS_TORCH = expected_skip("torch", "torch tensors need the 'torch' package (pip install 'portkern[torch]'; ./dev.sh torch)")


class Exported:
    """Any object that speaks DLPack and is not a NumPy array (as a JAX or CuPy array is)."""

    def __init__(self, array: np.ndarray, device: tuple[int, int] = (1, 0)) -> None:
        self.array, self.where = array, device

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.where


@pytest.fixture(scope="module")
def kernel(examples_bundle, tmp_path_factory):
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store

    store = Store(CacheConfig(tmp_path_factory.mktemp("cache") / "v1", 1 << 30, False))
    return portkern.load(examples_bundle, store=store).kernel(NAME)


def inputs(seed: int) -> list[np.ndarray]:
    return EXAMPLE.inputs(np.random.default_rng(seed))


def assert_reference(out: np.ndarray, arrays: list[np.ndarray]) -> None:
    np.testing.assert_allclose(out, EXAMPLE.reference(*arrays)[0], rtol=EXAMPLE.rtol, atol=EXAMPLE.atol)


def spy_on(kernel, monkeypatch) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(arrays the kernel's loaded code ran on, result arrays it returned), filled by each call."""
    executable = type(kernel.executable)
    call = executable.__call__
    ran: list[np.ndarray] = []
    returned: list[np.ndarray] = []

    def spy(self, *arrays):
        ran.extend(arrays)
        results = call(self, *arrays)
        returned.extend(results)
        return results

    monkeypatch.setattr(executable, "__call__", spy)
    return ran, returned


def test_dlpack_objects_are_viewed_without_a_copy_and_give_numpy(kernel, monkeypatch):
    arrays = inputs(0)
    ran, _ = spy_on(kernel, monkeypatch)
    out = kernel(*[Exported(a) for a in arrays])
    assert type(out) is np.ndarray
    assert_reference(out, arrays)
    assert len(ran) == len(arrays)
    assert all(np.shares_memory(seen, a) for seen, a in zip(ran, arrays))  # the caller's memory, not a copy


def test_dlpack_objects_mix_with_numpy_arrays(kernel):
    a, b, bias = arrays = inputs(1)
    out = kernel(Exported(a), b, Exported(bias))
    assert type(out) is np.ndarray
    assert_reference(out, arrays)


def test_dlpack_objects_get_the_typed_errors_of_arrays(kernel):
    a, b, bias = inputs(2)
    with pytest.raises(ArgumentTypeError, match="argument 0 must have dtype float32, got float64"):
        kernel(Exported(a.astype(np.float64)), b, bias)
    with pytest.raises(ArgumentShapeError, match="argument 1 must have shape"):
        kernel(a, Exported(b[:-1]), bias)
    # memory on a device other than the host (DLPack device type 2: CUDA) is refused, never read
    with pytest.raises(ArgumentTypeError, match=r"argument 2 is a test_tensors.Exported on DLPack device type 2; kernels take host memory"):
        kernel(a, b, Exported(bias, device=(2, 0)))


def test_non_contiguous_dlpack_objects_are_copied_as_arrays_are(kernel):
    arrays = inputs(3)
    strided = np.ascontiguousarray(arrays[0].T).T  # the same values, transposed strides
    assert not strided.flags.c_contiguous
    assert_reference(kernel(Exported(strided), *arrays[1:]), arrays)


def test_portkern_does_not_import_torch(examples_bundle):
    """Neither importing portkern nor calling a kernel (on arrays or DLPack objects) imports torch."""
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        import portkern
        from portkern.examples.reference import EXAMPLES
        sys.path.insert(0, {str(__file__.rpartition('/')[0])!r})
        from test_tensors import Exported
        arrays = EXAMPLES[{NAME!r}].inputs(np.random.default_rng(0))
        kernel = portkern.load({str(examples_bundle)!r}).kernel({NAME!r})
        kernel(*arrays), kernel(*[Exported(a) for a in arrays])
        assert "torch" not in sys.modules, "torch was imported"
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def test_torch_tensors_in_torch_tensors_out_without_copies(kernel, monkeypatch):
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    arrays = inputs(4)
    tensors = [torch.from_numpy(a) for a in arrays]
    viewed = check_arguments(NAME, kernel.signature, tensors)
    assert [v.ctypes.data for v in viewed] == [t.data_ptr() for t in tensors]  # the inputs are not copied
    ran, returned = spy_on(kernel, monkeypatch)
    out = kernel(*tensors)
    assert [a.ctypes.data for a in ran] == [t.data_ptr() for t in tensors]
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert out.data_ptr() == returned[0].ctypes.data  # the tensor is portkern's result array, not a copy
    assert_reference(out.numpy(), arrays)


def test_a_torch_result_alive_at_exit_is_not_reported_as_a_leak(examples_bundle, tmp_path):
    """A script that still holds a torch result (over portkern's result memory) when it exits
    exits cleanly: the result is right and nothing is reported on stderr."""
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    script = textwrap.dedent(
        f"""
        import numpy as np, torch
        import portkern
        from portkern.examples.reference import EXAMPLES
        example = EXAMPLES[{NAME!r}]
        arrays = example.inputs(np.random.default_rng(0))
        kept = portkern.load({str(examples_bundle)!r}).kernel({NAME!r})(*[torch.from_numpy(a) for a in arrays])
        np.testing.assert_allclose(kept.numpy(), example.reference(*arrays)[0], rtol=example.rtol, atol=example.atol)
        assert isinstance(kept, torch.Tensor)
        """
    )
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]


def test_torch_parameters_count_as_torch_tensors_and_mixed_calls_give_numpy(kernel):
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    a, b, bias = arrays = inputs(5)
    weights = torch.nn.Parameter(torch.from_numpy(b), requires_grad=False)
    out = kernel(torch.from_numpy(a), weights, torch.from_numpy(bias))
    assert isinstance(out, torch.Tensor)
    assert_reference(out.numpy(), arrays)
    mixed = kernel(torch.from_numpy(a), b, torch.from_numpy(bias))
    assert type(mixed) is np.ndarray
    assert_reference(mixed, arrays)


def test_non_contiguous_torch_tensors_are_copied_as_arrays_are(kernel):
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    arrays = inputs(6)
    first = torch.from_numpy(np.ascontiguousarray(arrays[0].T)).T
    assert not first.is_contiguous()
    out = kernel(first, *[torch.from_numpy(a) for a in arrays[1:]])
    assert isinstance(out, torch.Tensor)
    assert_reference(out.numpy(), arrays)


def test_torch_tensors_with_the_negative_bit_give_the_values_they_stand_for(kernel):
    """`z.conj().imag` is a lazily negated view: its memory holds imag(z) and its negative bit says to
    negate it (a bit `numpy.from_dlpack` ignores). A kernel computes on the values it stands for, and
    the caller's tensors are left as they were."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    a, b, bias = arrays = inputs(8)
    negated = [torch.complex(torch.zeros(x.shape), torch.from_numpy(-x)).conj().imag for x in (a, b)]
    assert all(t.is_neg() for t in negated)
    assert all(np.array_equal(np.from_dlpack(t), -x) for t, x in zip(negated, (a, b)))  # what the bit-blind view reads
    out = kernel(*negated, torch.from_numpy(bias))
    assert isinstance(out, torch.Tensor)
    assert_reference(out.numpy(), arrays)
    # a negative-bit tensor beside plain ones, and as the only torch tensor (results as NumPy then)
    mixed = kernel(a, negated[1], bias)
    assert type(mixed) is np.ndarray
    assert_reference(mixed, arrays)
    assert all(t.is_neg() for t in negated)
    np.testing.assert_array_equal(negated[0].resolve_neg().numpy(), a)


def test_torch_tensors_with_the_conjugate_bit_are_resolved_before_the_checks(kernel):
    """A conjugate view (which torch will not export through DLPack) is resolved, so that it meets
    the same checks as any tensor: here a complex64 argument where float32 is expected."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    a, b, bias = inputs(9)
    conjugated = torch.complex(torch.from_numpy(a), torch.from_numpy(a)).conj()
    assert conjugated.is_conj()
    with pytest.raises(ArgumentTypeError, match="argument 0 must have dtype float32, got complex64"):
        kernel(conjugated, torch.from_numpy(b), torch.from_numpy(bias))


def test_torch_dtype_shape_grad_and_device_are_typed_errors(kernel):
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    a, b, bias = (torch.from_numpy(x) for x in inputs(7))
    with pytest.raises(ArgumentTypeError, match="argument 0 must have dtype float32, got float64"):
        kernel(a.double(), b, bias)
    with pytest.raises(ArgumentTypeError, match="argument 0: a torch.Tensor that NumPy cannot view"):
        kernel(a.bfloat16(), b, bias)  # NumPy has no bfloat16
    with pytest.raises(ArgumentShapeError, match="argument 1 must have shape"):
        kernel(a, b[:-1], bias)
    with pytest.raises(ArgumentTypeError, match=r"argument 2 is a torch.Tensor that requires grad; pass tensor.detach\(\)"):
        kernel(a, b, bias.clone().requires_grad_(True))
    meta = torch.empty(a.shape, dtype=torch.float32, device="meta")  # no memory at all
    with pytest.raises(ArgumentTypeError, match="argument 0"):
        kernel(meta, b, bias)
