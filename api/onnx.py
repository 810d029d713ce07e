"""portkern as an ONNX backend (`onnx.backend.base.Backend`): a model is built into a bundle,
finalised for the device (cached, tuned on request) and run, exactly as `portkern.load` does.

    import portkern.onnx as backend
    rep = backend.prepare(model, "CPU")
    outputs = rep.run([x])           # or backend.run_model(model, [x])
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from portkern import errors
from portkern.errors import ArgumentTypeError, BuildError, DeviceError, DispatchTuningError, FinalizeError, PortkernError
from portkern.jit.loader import Kernel, load
from portkern.jit.workers import Job, shared_pool
from portkern.portable.onnx_model import as_kernel, graph_inputs, kernel_name, operators
from portkern.cache.store import Store

#: How long building one model may take.
BUILD_TIMEOUT_S = 1800
#: ONNX device types -> portkern device specs.
DEVICES = {"CPU": "cpu"}


class PortkernRep(BackendRep):
    """A model finalised for one device; `run` takes its inputs in graph order (a list) or by name."""

    def __init__(self, kernel: Kernel, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self.kernel = kernel
        self.input_names = tuple(inputs)
        self.output_names = tuple(outputs)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The model's outputs (a namedtuple by output name) for `inputs`."""
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise ArgumentTypeError(f"{self.kernel.name}: no value for input {', '.join(missing)}")
            inputs = [inputs[n] for n in self.input_names]
        elif isinstance(inputs, (np.ndarray, np.generic)):
            inputs = [inputs]
        results = self.kernel(*(np.asarray(a) if isinstance(a, (np.ndarray, np.generic)) else a for a in inputs))
        if not isinstance(results, tuple):
            results = (results,)
        return namedtupledict("Outputs", self.output_names)(*results)


class PortkernBackend(Backend):
    """The ONNX backend API over portkern's build -> bundle -> finalise -> run."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PortkernRep:
        """Build the model into a bundle and finalise it for `device`.

        Options: `tune` (as for `LoadedBundle.kernel`), `store` (a `portkern.cache.store.Store`),
        `name` (the kernel's name; default from the graph's name).
        """
        super().prepare(model, device, **kwargs)
        spec = device_spec(device)
        name = kernel_name(kwargs.get("name") or model.graph.name or "model")
        with tempfile.TemporaryDirectory(prefix="portkern-onnx-") as tmp:
            where = Path(tmp)
            (where / "model.onnx").write_bytes(as_kernel(model, name).SerializeToString())
            (where / "manifest.yaml").write_text(f"bundle: {name}\nkernels:\n  - name: {name}\n    source: model.onnx\n")
            ops = operators(model)
            what = f"ONNX model {name!r} ({', '.join(ops[:6]) + (', ...' if len(ops) > 6 else '') or 'no operators'})"
            build_isolated(where / "manifest.yaml", where / "model.pkb", what, str(where / "model.onnx"))
            store: Store | None = kwargs.get("store")
            try:
                kernel = load(where / "model.pkb", store=store).kernel(name, device=spec, tune=kwargs.get("tune"))
            except FinalizeError as exc:
                raise type(exc)(f"{what}: {exc}") from None
        return PortkernRep(kernel, [i.name for i in graph_inputs(model)], [o.name for o in model.graph.output])

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        """`prepare(model, device).run(inputs)`."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info=None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one node on `inputs` (arrays in the node's input order; empty names are absent inputs)."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info)
        return cls.run_model(node_model(node, inputs, kwargs.pop("opset", None)), inputs, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether `device` (an ONNX device string, "CPU") is one portkern runs on here."""
        try:
            device_spec(device)
        except DeviceError:
            return False
        return True


def build_isolated(manifest: Path, output: Path, what: str, source: str) -> None:
    """`portkern build` in a worker of the shared pool (kept alive between models): the IREE
    compiler lowers the model there, so that a compiler crash is a BuildError, not the end of the
    caller's process."""
    result = shared_pool().run([Job.build(0, what, str(manifest), str(output), BUILD_TIMEOUT_S)])[0]
    for note in result.data.get("warnings") or ():
        warnings.warn(str(note).replace(source, what), stacklevel=3)
    if result.ok:
        return
    if result.status == "timeout":
        raise BuildError(f"{what}: building it took longer than {BUILD_TIMEOUT_S} s")
    if result.status in ("crash", "oom"):
        raise BuildError(f"{what}: the IREE compiler crashed building it ({result.error})")
    kind = getattr(errors, result.error_type, None) if result.error_type else None
    if not (isinstance(kind, type) and issubclass(kind, PortkernError)) or kind is DispatchTuningError:
        kind = BuildError
    raise kind(result.error.replace(source, what))


def device_spec(device: str) -> str:
    """The portkern device spec for an ONNX device string, or DeviceError."""
    try:
        kind = Device(device).type
    except Exception:  # onnx raises a bare Exception naming the string
        raise DeviceError(f"{device!r} is not an ONNX device (e.g. 'CPU')") from None
    for name, spec in DEVICES.items():
        if kind == getattr(DeviceType, name):
            return spec
    raise DeviceError(f"the portkern ONNX backend runs on {', '.join(DEVICES)}, not {device!r}")


def node_model(node: onnx.NodeProto, inputs: Sequence[np.ndarray], opset: int | None = None) -> onnx.ModelProto:
    """A one-node model whose inputs have the given arrays' types and shapes."""
    from onnx import helper, shape_inference

    present = [n for n in node.input if n]
    if len(present) != len(inputs):
        raise ArgumentTypeError(f"{node.op_type} node has {len(present)} inputs, got {len(inputs)} arrays")
    values = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.shape(a)) for n, a in zip(present, inputs)]
    outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    graph = helper.make_graph([node], f"{node.op_type.lower()}_node", values, outputs)
    imports = [helper.make_opsetid(node.domain or "", opset or onnx.defs.onnx_opset_version())]
    model = helper.make_model(graph, opset_imports=imports)
    inferred = shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


prepare = PortkernBackend.prepare
run_model = PortkernBackend.run_model
run_node = PortkernBackend.run_node
supports_device = PortkernBackend.supports_device
