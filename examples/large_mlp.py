"""Generated MLP-style ONNX models of any size, and their NumPy reference.

mlp(x) = relu(... relu(x @ W0 + b0) ...) @ Wn + bn, with float32 weights drawn per layer from
`numpy.random.default_rng(seed + layer)` and scaled by 1/sqrt(fan_in). Writing holds one
layer's weights at a time when the weights go to an ONNX external data file (`external=True`,
the form models over 2 GB must take); inline models are one protobuf, held whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

OPSET = 17
IR_VERSION = 8


def layer(widths: Sequence[int], index: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights and bias of layer `index` (widths[index] -> widths[index + 1])."""
    fan_in, fan_out = widths[index], widths[index + 1]
    rng = np.random.default_rng(seed + index)
    weights = rng.standard_normal((fan_in, fan_out), dtype=np.float32)
    weights *= np.float32(1.0 / np.sqrt(fan_in))
    bias = rng.uniform(-0.1, 0.1, fan_out).astype(np.float32)
    return weights, bias


def layers(widths: Sequence[int], seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for index in range(len(widths) - 1):
        yield layer(widths, index, seed)


def weight_bytes(widths: Sequence[int]) -> int:
    """Bytes of all weights and biases."""
    return sum((widths[i] + 1) * widths[i + 1] * 4 for i in range(len(widths) - 1))


def reference(x: np.ndarray, widths: Sequence[int], seed: int) -> np.ndarray:
    """The model's output for `x`, computed one layer at a time."""
    h = x.astype(np.float32)
    last = len(widths) - 2
    for index, (weights, bias) in enumerate(layers(widths, seed)):
        h = h @ weights + bias
        if index < last:
            np.maximum(h, 0, out=h)
    return h


def write_mlp(path: str | Path, widths: Sequence[int], batch: int, seed: int = 0, external: bool = False) -> Path:
    """Write the model to `path` (weights in `<path>.data` next to it when `external`)."""
    from onnx import TensorProto, helper, numpy_helper

    path = Path(path)
    data_path = path.with_name(path.name + ".data")
    nodes, initializers = [], []
    current = "x"
    last = len(widths) - 2
    out = open(data_path, "wb") if external else None
    try:
        for index, (weights, bias) in enumerate(layers(widths, seed)):
            for name, array in ((f"W{index}", weights), (f"b{index}", bias)):
                if out is None:
                    initializers.append(numpy_helper.from_array(array, name=name))
                    continue
                tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape)
                tensor.data_location = TensorProto.EXTERNAL
                for key, value in (("location", data_path.name), ("offset", str(out.tell())), ("length", str(array.nbytes))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
                out.write(array.tobytes())
                initializers.append(tensor)
            del weights, bias
            nodes.append(helper.make_node("MatMul", [current, f"W{index}"], [f"m{index}"]))
            after = f"h{index}" if index < last else "y"
            nodes.append(helper.make_node("Add", [f"m{index}", f"b{index}"], [after if index == last else f"a{index}"]))
            if index < last:
                nodes.append(helper.make_node("Relu", [f"a{index}"], [after]))
            current = after
    finally:
        if out is not None:
            out.close()
    graph = helper.make_graph(
        nodes,
        "mlp",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, widths[0]])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, widths[-1]])],
        initializer=initializers,
    )
    model = helper.make_model(graph, producer_name="portkern-examples", opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path
