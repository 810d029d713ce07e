"""The example kernels shipped with portkern: a manifest, its sources and NumPy references."""

from pathlib import Path

#: The example manifest (four fused GEMM kernels in MLIR and one ONNX model).
MANIFEST = Path(__file__).resolve().parent / "manifest.yaml"

#: The OpenCL C examples (vector add, tiled matmul, row softmax); building them
#: needs clang-15, llvm-spirv-15 and spirv-tools, running them an OpenCL device.
OPENCL_MANIFEST = Path(__file__).resolve().parent / "manifest_opencl.yaml"

#: OpenCL C examples with a parameter space (a tiled matmul and a tiled transpose): every
#: valid point is built into the bundle, and the device tunes among them.
OPENCL_TUNING_MANIFEST = Path(__file__).resolve().parent / "manifest_opencl_tuning.yaml"

#: A 768x384x640 f32 GEMM+ReLU (not in the manifest): the GPU tuning spaces' mid-size case.
GEMM_RELU_768 = Path(__file__).resolve().parent / "gemm_relu_768.mlir"
