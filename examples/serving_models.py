"""A deployer's own small models for the serving bench (`bench/serving.py`): an MNIST-sized MLP
and CNN as ONNX graphs with fixed weights, and their NumPy references. Needs `onnx`.

    mnist_mlp(x[8,784])    = softmax(relu(relu(x W1 + b1) W2 + b2) W3 + b3)       784-128-64-10
    mnist_cnn(x[1,1,28,28]) = maxpool(relu(conv3x3(...))) twice (8, 16 channels), then a 784x10 Gemm
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from portkern.base.records import frozen_record

OPSET = 17


@frozen_record
class ServingModel:
    name: str
    #: The ONNX model, serialized.
    data: bytes
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    reference: Callable[..., list[np.ndarray]]
    rtol: float
    atol: float


def _weights(seed: int, shapes: dict[str, tuple[int, ...]], fan_in: dict[str, float]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.uniform(-1.0, 1.0, s) / np.sqrt(fan_in[k])).astype(np.float32) for k, s in shapes.items()}


def _model(name: str, nodes: list, x_shape: list[int], y_shape: list[int], weights: dict[str, np.ndarray]) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, name,
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        initializer=[numpy_helper.from_array(v, name=k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString(deterministic=True)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def mnist_mlp() -> ServingModel:
    from onnx import helper

    w = _weights(1, {"W1": (784, 128), "b1": (128,), "W2": (128, 64), "b2": (64,), "W3": (64, 10), "b3": (10,)},
                 {"W1": 784, "b1": 784, "W2": 128, "b2": 128, "W3": 1, "b3": 64})
    nodes = [
        helper.make_node("Gemm", ["x", "W1", "b1"], ["h1"]), helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "W2", "b2"], ["h2"]), helper.make_node("Relu", ["h2"], ["a2"]),
        helper.make_node("Gemm", ["a2", "W3", "b3"], ["z"]), helper.make_node("Softmax", ["z"], ["y"], axis=-1),
    ]

    def reference(x: np.ndarray) -> list[np.ndarray]:
        v = {k: a.astype(np.float64) for k, a in w.items()}
        a1 = np.maximum(x.astype(np.float64) @ v["W1"] + v["b1"], 0.0)
        a2 = np.maximum(a1 @ v["W2"] + v["b2"], 0.0)
        return [_softmax(a2 @ v["W3"] + v["b3"]).astype(np.float32)]

    return ServingModel("mnist_mlp", _model("mnist_mlp", nodes, [8, 784], [8, 10], w),
                        lambda rng: [rng.uniform(0.0, 1.0, (8, 784)).astype(np.float32)], reference, 1e-4, 1e-6)


def _conv3x3_relu_pool(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NCHW 3x3 convolution (padding 1) + bias, ReLU, 2x2 max pooling, in float64."""
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # N C H W 3 3
    y = np.maximum(np.einsum("nchwij,ocij->nohw", windows, w) + b[None, :, None, None], 0.0)
    n, c, h, wd = y.shape
    return y.reshape(n, c, h // 2, 2, wd // 2, 2).max(axis=(3, 5))


def mnist_cnn() -> ServingModel:
    from onnx import helper

    w = _weights(2, {"C1": (8, 1, 3, 3), "c1": (8,), "C2": (16, 8, 3, 3), "c2": (16,), "W": (784, 10), "b": (10,)},
                 {"C1": 9 / 3, "c1": 9, "C2": 72 / 3, "c2": 72, "W": 784 / 4, "b": 784})
    conv: dict[str, Any] = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    pool: dict[str, Any] = {"kernel_shape": [2, 2], "strides": [2, 2]}
    nodes = [
        helper.make_node("Conv", ["x", "C1", "c1"], ["h1"], **conv), helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("MaxPool", ["a1"], ["p1"], **pool),
        helper.make_node("Conv", ["p1", "C2", "c2"], ["h2"], **conv), helper.make_node("Relu", ["h2"], ["a2"]),
        helper.make_node("MaxPool", ["a2"], ["p2"], **pool),
        helper.make_node("Flatten", ["p2"], ["f"]), helper.make_node("Gemm", ["f", "W", "b"], ["y"]),
    ]

    def reference(x: np.ndarray) -> list[np.ndarray]:
        v = {k: a.astype(np.float64) for k, a in w.items()}
        p1 = _conv3x3_relu_pool(x.astype(np.float64), v["C1"], v["c1"])
        p2 = _conv3x3_relu_pool(p1, v["C2"], v["c2"])
        return [(p2.reshape(p2.shape[0], -1) @ v["W"] + v["b"]).astype(np.float32)]

    return ServingModel("mnist_cnn", _model("mnist_cnn", nodes, [1, 1, 28, 28], [1, 10], w),
                        lambda rng: [rng.uniform(0.0, 1.0, (1, 1, 28, 28)).astype(np.float32)], reference, 1e-4, 1e-5)


def manifest(directory: Path) -> Path:
    """The models written under `directory` with a manifest of them (bundle `deployer`)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["bundle: deployer", "kernels:"]
    for model in (mnist_mlp(), mnist_cnn()):
        (directory / f"{model.name}.onnx").write_bytes(model.data)
        lines += [f"  - name: {model.name}", f"    source: {model.name}.onnx"]
    path = directory / "manifest.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path
