"""`kind: torch`: a `.pt2` program built with its weights as parameters, loaded and run without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import expected_skip, one_kernel_bundle

torch = pytest.importorskip("torch", reason=expected_skip("torch", "PyTorch programs need the 'torch' package (pip install 'portkern[torch]')"))
pytest.importorskip("iree.turbine", reason=expected_skip("torch", "PyTorch programs need 'iree-turbine' on the build host (pip install 'portkern[torch]')"))

import portkern  # noqa: E402
from portkern.base.errors import ArgumentShapeError, BuildError  # noqa: E402

RTOL = ATOL = 1e-4


class Block(torch.nn.Module):
    """A small residual MLP block with layer norm and GELU."""

    def __init__(self, width: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    where = tmp_path_factory.mktemp("torch")
    torch.manual_seed(0)
    model = Block().eval()
    batch = torch.export.Dim("batch", max=1024)
    exported = torch.export.export(model, (torch.randn(8, 64),), dynamic_shapes=({0: batch},))
    torch.export.save(exported, str(where / "block.pt2"))
    return one_kernel_bundle(where, "block.pt2", "block", bundle="torchy"), model


def test_a_pt2_program_builds_with_its_weights_as_parameters(program, store):
    path, model = program
    loaded = portkern.load(path, store=store)
    record = loaded.record("block")
    assert record.kind == "torch" and record.signature.inputs[0].shape == (None, 64)
    names = {p.name for p in record.parameters}
    assert names == set(model.state_dict())
    assert sum(p.size for p in record.parameters) == sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for rows in (3, 8, 100):  # the dynamic batch dimension was kept
        x = torch.randn(rows, 64)
        with torch.no_grad():
            expected = model(x)
        out = loaded.kernel("block")(x)
        assert isinstance(out, torch.Tensor)
        np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=RTOL, atol=ATOL)


def test_the_device_needs_no_torch(program, tmp_path):
    path, model = program
    x = np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        sys.modules["torch"] = None  # importing torch would fail
        import portkern
        y = portkern.load({str(path)!r}).kernel("block")(np.load({str(tmp_path / "x.npy")!r}))
        np.save({str(tmp_path / "y.npy")!r}, y)
        """
    )
    env = {"PORTKERN_CACHE_DIR": str(tmp_path / "cache")}
    import os

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=RTOL, atol=ATOL)


def test_a_program_of_another_iree_release_runs_from_its_source_stage_without_its_weights_twice(program, store, tmp_path):
    import zlib

    from helpers import reseal

    from portkern.portable.parameters import referenced
    from portkern.portable.source import MLIR_TEXT, CompatibilityWarning

    path, model = program
    record = portkern.load(path, store=store).record("block")
    source = record.source_stage()
    weights = sum(p.size for p in record.parameters)
    assert source.format == MLIR_TEXT and source.size < weights // 10
    text = zlib.decompress(portkern.load(path, store=store).bundle.blob(source.blob))
    assert {name for _, name in referenced(text)} == {p.name for p in record.parameters}  # weights by name only
    foreign = reseal(path, tmp_path / "foreign.pkb", "3.12.0")
    with pytest.warns(CompatibilityWarning, match="built with IREE 3.12.0"):
        kernel = portkern.load(foreign, store=store).kernel("block")
    assert kernel.stage == "source (built with IREE 3.12.0)"
    x = torch.randn(5, 64)
    with torch.no_grad():
        expected = model(x)
    np.testing.assert_allclose(kernel(x).numpy(), expected.numpy(), rtol=RTOL, atol=ATOL)


def test_a_transformer_layer_tunes_every_dispatch_or_says_why_not(tmp_path, store):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, batch_first=True).eval()
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        torch.export.save(torch.export.export(layer, (x,)), str(tmp_path / "layer.pt2"))
        expected = layer(x)
    kernel = portkern.load(one_kernel_bundle(tmp_path, "layer.pt2", "layer"), store=store).kernel("layer", tune="quick")
    dispatches = kernel.tuning.dispatches
    assert any("attention" in d.name for d in dispatches)
    assert all(d.source in ("search", "db") or d.note for d in dispatches)  # searched, or a stated reason
    np.testing.assert_allclose(kernel(x).numpy(), expected.numpy(), rtol=RTOL, atol=ATOL)


class CausalMask(torch.nn.Module):
    """Scores masked as transformers makes a causal mask: an all-true boolean `new_ones` `&`-ed
    with the position comparisons (a boolean literal and `aten.__and__`, which IREE's torch input
    conversion does not take as they are)."""

    def forward(self, scores):
        n = scores.shape[-1]
        rows = torch.arange(n).view(n, 1)
        cols = torch.arange(n).view(1, n)
        allowed = rows.new_ones((), dtype=torch.bool) & (cols <= rows)
        allowed = allowed & (rows >= 0) | (cols > n)
        return scores.masked_fill(~allowed, float("-inf")).softmax(-1)


def test_a_boolean_mask_program_builds_and_matches_torch(tmp_path, store):
    scores = torch.randn(2, 8, 8)
    torch.export.save(torch.export.export(CausalMask(), (scores,)), str(tmp_path / "mask.pt2"))
    path = one_kernel_bundle(tmp_path, "mask.pt2", "mask")
    out = portkern.load(path, store=store).kernel("mask")(scores)
    np.testing.assert_allclose(out.numpy(), CausalMask()(scores).numpy(), rtol=RTOL, atol=ATOL)
    assert (out.numpy()[:, 0, 1:] == 0).all() and (out.numpy()[:, -1] > 0).all()  # the mask both cuts and passes


class BiasedMLP(torch.nn.Module):
    """An MLP whose output is added to its second input: both have the batch dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 4)

    def forward(self, x, bias):
        return self.down(torch.relu(self.up(x))) + bias


@pytest.fixture(scope="module")
def named_program(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    where = tmp_path_factory.mktemp("named")
    torch.manual_seed(1)
    model = BiasedMLP().eval()
    batch = torch.export.Dim("batch", max=1024)
    exported = torch.export.export(model, (torch.randn(8, 16), torch.randn(8, 4)), dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(exported, str(where / "mlp.pt2"))
    return where, model


def test_a_pt2_program_keeps_its_input_names_in_a_checked_contract(named_program, capsys):
    from helpers import cli_json

    where, _ = named_program
    status, shown = cli_json(capsys, "inspect", one_kernel_bundle(where, "mlp.pt2", "mlp"))
    assert status == 0
    contract = shown["kernels"][0]["signature"]["contract"]
    assert contract["names"] == ["x", "bias"]  # the forward parameters, not arg0, arg1
    assert contract["inputs"] == [["M", 16], ["M", 4]] and contract["results"] == [["M", 4]]
    assert contract["origin"] == "ir"


def test_a_pt2_programs_input_names_take_shapes_and_calls_by_name(named_program, store):
    where, model = named_program
    path = one_kernel_bundle(where, "mlp.pt2", "mlp", extra="    shapes: {x: [batch, 16], bias: [batch, 4]}\n", bundle="stated")
    kernel = portkern.load(path, store=store).kernel("mlp")
    assert str(kernel.record.signature.contract) == "(batchx16, batchx4) -> batchx4"
    x, bias = torch.randn(5, 16), torch.randn(5, 4)
    with torch.no_grad():
        expected = model(x, bias)
    np.testing.assert_allclose(kernel(bias=bias, x=x).numpy(), expected.numpy(), rtol=RTOL, atol=ATOL)
    with pytest.raises(ArgumentShapeError, match="batch"):
        kernel(x=x, bias=torch.randn(6, 4))  # the batch of the input added at the output disagrees with x's


def test_a_pt2_programs_result_stated_with_another_batch_is_refused(named_program):
    where, _ = named_program
    with pytest.raises(BuildError, match="result0 dimension 0 different sizes"):
        one_kernel_bundle(where, "mlp.pt2", "mlp", extra="    shapes: {x: [batch, 16], result0: [rows, 4]}\n", bundle="other")


def test_input_names_replace_only_the_entrys_own_arguments():
    from portkern.portable.torch_import import name_arguments

    text = "module {\n  func.func @main(%arg0: t, %arg1: t) -> t {\n    %arg10 = op %arg0, %arg1 : t\n    return %arg10 : t\n  }\n}\n"
    named = "module {\n  func.func @main(%x: t, %w: t) -> t {\n    %arg10 = op %x, %w : t\n    return %arg10 : t\n  }\n}\n"
    assert name_arguments(text, "main", ["x", "w"]) == named  # %arg10 is not %arg1 followed by 0
    assert name_arguments(text, "main", ["x", "arg10"]) == text  # a name the function uses already: left as printed
    assert name_arguments(text, "main", ["x"]) == text  # not one name per argument
