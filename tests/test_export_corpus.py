"""A seeded sample of the architecture corpus (bench/export_corpus.py runs all of it): small
random-weight models (transformers' and a MobileNetV3) exported the ways users export them
(`torch.onnx.export` with and without dynamo, `torch.export.save`'s `.pt2` with a transformers
`ModelOutput` as its output), built through portkern, each in a fresh process, and compared with
eager PyTorch. (What is refused, and why: docs/export-corpus.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import expected_skip

for _module in ("torch", "iree.turbine", "transformers", "onnxscript"):
    pytest.importorskip(_module, reason=expected_skip("torch", f"the export corpus needs {_module!r} (pip install 'portkern[torch]')"))

BENCH = Path(__file__).resolve().parents[1] / "bench" / "export_corpus.py"
#: The bench's tolerance against eager PyTorch (rtol and atol).
TOLERANCE = 1e-4

SAMPLE = [
    ("gpt2-tiny", "onnx-dynamo", "manifest"),  # model.onnx + model.onnx.data, as the exporter writes them
    ("bert-tiny", "onnx-dynamo", "prepare"),  # portkern.onnx.prepare(onnx.load(...))
    ("bert-tiny", "pt2", "manifest"),  # a transformers ModelOutput registered in the import process
    ("resnet-tiny", "pt2", "manifest"),  # in-place ReLU and batch norm
    ("resnet-tiny", "onnx-ts", "manifest"),  # torch.onnx.export(..., dynamo=False), TorchScript
    ("bert-tiny", "onnx-ts", "manifest"),  # called by keyword; Constant nodes with unnamed large values
    ("gpt2-tiny", "pt2", "manifest"),  # a causal mask from a boolean new_ones and aten.__and__
    ("gpt2-tiny", "onnx-ts", "prepare"),  # two inputs; an expand's shape computed from constants
    ("mobilenetv3-tiny", "pt2", "manifest"),  # hardswish, hardsigmoid, squeeze-excitation
]


@pytest.mark.parametrize(("model", "route", "intake"), SAMPLE, ids=["-".join(s) for s in SAMPLE])
def test_an_exported_model_builds_and_matches_eager_pytorch(model, route, intake, tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH), "--models", model, "--routes", route, "--intake", intake, "--json"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    (row,) = json.loads(done.stdout)
    assert (row["model"], row["route"], row["intake"]) == (model, route, intake)
    assert row["built"] and row["correct"], row["reason"]
    assert row["max_error"] <= TOLERANCE
    assert done.returncode == 0
