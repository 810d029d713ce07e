"""The example kernels shipped with portkern: a manifest, its sources and NumPy references."""

from pathlib import Path

#: The example manifest (four fused GEMM kernels in MLIR and one ONNX model).
MANIFEST = Path(__file__).resolve().parent / "manifest.yaml"
