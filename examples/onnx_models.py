"""ONNX models to exercise portkern on, from the `onnx` package (needs it installed): its shipped
`light` models (small stand-ins of resnet50, densenet121, ...), its shipped `pytorch-converted`
models, and node conformance cases (generated in-process; the wheel ships no node data).

`manifest` writes a model set as a manifest, each model made a kernel by
`portkern.portable.onnx_model.as_kernel` (graph named after the kernel: PyTorch exports name the
graph `torch-jit-export`; values keep their names, `0`, `1`, ...).
"""

from __future__ import annotations

import random
from pathlib import Path

from portkern.base.records import frozen_record
from portkern.portable.onnx_model import as_kernel, kernel_name

#: A representative subset of the node conformance cases: convolutions, pooling, reductions,
#: softmax and attention, contractions, normalisation, elementwise.
NODE_CASES = (
    "test_basic_conv_with_padding",
    "test_conv_with_strides_padding",
    "test_convtranspose",
    "test_maxpool_2d_default",
    "test_averagepool_2d_pads",
    "test_globalaveragepool",
    "test_reduce_sum_keepdims_random",
    "test_reduce_mean_keepdims_random",
    "test_softmax_axis_1",
    "test_logsoftmax_axis_1",
    "test_attention_4d",
    "test_matmul_3d",
    "test_gemm_default_vector_bias",
    "test_einsum_batch_matmul",
    "test_layer_normalization_3d_axis1_epsilon",
    "test_batchnorm_example",
    "test_transpose_default",
    "test_relu",
)


@frozen_record
class Model:
    """One ONNX model: its kernel name, its suite and where its bytes come from."""

    name: str
    suite: str
    path: Path | None = None
    #: A generated model (node cases), as serialized bytes.
    data: bytes | None = None


def _data_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def light_models() -> list[Model]:
    """The `light` models shipped in the onnx package."""
    return [Model(kernel_name(p.stem), "light", p) for p in sorted((_data_dir() / "light").glob("*.onnx"))]


def pytorch_converted_paths() -> list[Path]:
    """The `model.onnx` files of the `pytorch-converted` models shipped in the onnx package."""
    return sorted((_data_dir() / "pytorch-converted").glob("*/model.onnx"))


def pytorch_converted_models() -> list[Model]:
    """The `pytorch-converted` models shipped in the onnx package."""
    return [Model(kernel_name(p.parent.name.removeprefix("test_")), "pytorch-converted", p) for p in pytorch_converted_paths()]


def node_models(names: tuple[str, ...] = NODE_CASES) -> list[Model]:
    """The named node conformance cases (generating them takes ~30 s the first time in a process)."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # the generators' own overflow warnings
        warnings.simplefilter("ignore")
        cases = {case.name: case for case in collect_testcases("") if case.name in names}
    missing = [name for name in names if name not in cases]
    if missing:
        raise LookupError(f"onnx has no node cases named {', '.join(missing)}")
    models = []
    for name in names:
        proto = cases[name].model
        if proto is None:  # every node case carries its generated model
            raise LookupError(f"onnx's node case {name} has no generated model")
        models.append(Model(kernel_name(name.removeprefix("test_")), "node", data=proto.SerializeToString()))
    return models


def seeded_subset(models: list[Model], count: int, seed: int) -> list[Model]:
    """`count` of the models, the same ones for the same seed and list."""
    return random.Random(seed).sample(sorted(models, key=lambda m: (m.suite, m.name)), min(count, len(models)))


def manifest(models: list[Model], directory: Path, bundle: str) -> Path:
    """A manifest of the models under `directory` (each graph renamed after its kernel)."""
    import onnx

    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"bundle: {bundle}", "kernels:"]
    for model in models:
        proto = as_kernel(onnx.load_from_string(model.data) if model.data is not None else onnx.load(str(model.path)), model.name)
        path = directory / f"{model.name}.onnx"
        path.write_bytes(proto.SerializeToString())
        lines += [f"  - name: {model.name}", f"    source: {path.name}"]
    target = directory / "manifest.yaml"
    target.write_text("\n".join(lines) + "\n")
    return target
