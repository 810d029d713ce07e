"""Deterministically generate examples/mlp.onnx.

mlp(x) = softmax(relu(x @ W1 + b1) @ W2 + b2, axis=-1)
with x[32,64] float32, W1[64,128], b1[128], W2[128,16], b2[16].

Weights come from numpy RandomState(0) and are scaled by 1/sqrt(fan_in) so
activations stay O(1) and the softmax is not saturated.  Running this script
always rewrites a byte-identical mlp.onnx.
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17
BATCH, IN, HIDDEN, OUT = 32, 64, 128, 16


def make_weights() -> dict[str, np.ndarray]:
    rs = np.random.RandomState(0)
    w1 = rs.uniform(-1.0, 1.0, (IN, HIDDEN)) / np.sqrt(IN)
    b1 = rs.uniform(-0.1, 0.1, (HIDDEN,))
    w2 = rs.uniform(-1.0, 1.0, (HIDDEN, OUT)) * (2.0 / np.sqrt(HIDDEN))
    b2 = rs.uniform(-0.1, 0.1, (OUT,))
    return {k: v.astype(np.float32) for k, v in
            {"W1": w1, "b1": b1, "W2": w2, "b2": b2}.items()}


def make_model() -> onnx.ModelProto:
    weights = make_weights()
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"], name="matmul1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="add1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "W2"], ["h3"], name="matmul2"),
        helper.make_node("Add", ["h3", "b2"], ["logits"], name="add2"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",  # iree-import-onnx names the entry function after the graph
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, IN])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, OUT])],
        initializer=[numpy_helper.from_array(v, name=k) for k, v in weights.items()],
    )
    model = helper.make_model(
        graph,
        producer_name="portkern-examples",
        producer_version="1",
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    out = Path(__file__).resolve().parent / "mlp.onnx"
    out.write_bytes(make_model().SerializeToString(deterministic=True))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
