"""portkern as an ONNX backend (`onnx.backend.base.Backend`): a model is built into a bundle,
finalised for the device (cached, tuned on request) and run, exactly as `portkern.load` does.

    import portkern.onnx as backend
    rep = backend.prepare(model, "CPU")
    outputs = rep.run([x])           # or backend.run_model(model, [x])
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from portkern.base import errors
from portkern.base.errors import ArgumentTypeError, BuildError, BundleError, DeviceError, DispatchTuningError, FinalizeError, PortkernError
from portkern.base.framing import read_bounded
from portkern.bundle import load
from portkern.cache.layout import BUNDLES
from portkern.cache.scratch import part_path, stale_part
from portkern.cache.store import Store, default_store
from portkern.jit.loader import Kernel, LoadedBundle
from portkern.jit.workers import Job, shared_pool
from portkern.portable.onnx_model import as_kernel, graph_inputs, kernel_name, operators
from portkern.portable.onnx_parameters import has_external_data
from portkern.portable.producer import installed_compiler

log = logging.getLogger(__name__)

#: How long building one model may take.
BUILD_TIMEOUT_S = 1800
#: ONNX device types -> portkern device specs.
DEVICES = {"CPU": "cpu"}


class PortkernRep(BackendRep):
    """A model finalised for one device; `run` takes its inputs in graph order (a list) or by name."""

    def __init__(self, kernel: Kernel, inputs: Sequence[str], outputs: Sequence[str], bundle_origin: str = "built") -> None:
        self.kernel = kernel
        self.input_names = tuple(inputs)
        self.output_names = tuple(outputs)
        #: Where the model's bundle came from: "built" by this `prepare`, or "cache" (a bundle an
        #: earlier `prepare` built for the same model bytes and options, kept in the cache directory).
        self.bundle_origin = bundle_origin

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The model's outputs (a namedtuple by output name) for `inputs`."""
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise ArgumentTypeError(f"{self.kernel.name}: no value for input {', '.join(missing)}")
            inputs = [inputs[n] for n in self.input_names]
        elif isinstance(inputs, (np.ndarray, np.generic)):
            inputs = [inputs]
        results = self.kernel(*(np.asanyarray(a) if isinstance(a, (np.ndarray, np.generic)) else a for a in inputs))
        if not isinstance(results, tuple):
            results = (results,)
        return namedtupledict("Outputs", self.output_names)(*results)


class PortkernBackend(Backend):
    """The ONNX backend API over portkern's build -> bundle -> finalise -> run."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PortkernRep:
        """Build the model into a bundle (or load the one an earlier `prepare` kept in the cache for
        the same model and options: `rep.bundle_origin`) and finalise it for `device`.

        Options: `tune` (as for `LoadedBundle.kernel`), `store` (a `portkern.cache.store.Store`),
        `name` (the kernel's name; default from the graph's name), and the manifest's shape choices
        (docs/shapes.md): `shapes` (by input or output name: sizes, symbols, result expressions),
        `constraints` (conditions over the symbols) and `unchecked` (True: build without a shape
        contract where none can be derived).
        """
        if not isinstance(model, onnx.ModelProto):  # (onnx's own check would read a path it is given, to its end)
            raise ArgumentTypeError(
                f"prepare() takes an onnx.ModelProto, got {type(model).__name__}: load the model first (onnx.load(path))"
            )
        super().prepare(model, device, **kwargs)
        spec = device_spec(device)
        name = kernel_name(kwargs.get("name") or model.graph.name or "model")
        ops = operators(model)
        what = f"ONNX model {name!r} ({', '.join(ops[:6]) + (', ...' if len(ops) > 6 else '') or 'no operators'})"
        store: Store | None = kwargs.get("store")
        # named with our pid, so that `portkern cache verify` removes it if this process is killed
        with tempfile.TemporaryDirectory(prefix=f"portkern-onnx-{os.getpid()}-") as tmp:
            bundle, origin = model_bundle(model, name, what, store, Path(tmp), shape_options(kwargs))
            try:
                kernel = bundle.kernel(name, device=spec, tune=kwargs.get("tune"))
            except FinalizeError as exc:
                raise type(exc)(f"{what}: {exc}") from None
        return PortkernRep(kernel, [i.name for i in graph_inputs(model)], [o.name for o in model.graph.output], origin)

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


def shape_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`prepare`'s `shapes=`, `constraints=` and `unchecked=` as manifest entries (those given)."""
    options: dict[str, Any] = {}
    if kwargs.get("shapes") is not None:
        options["shapes"] = {str(k): list(v) for k, v in dict(kwargs["shapes"]).items()}
    if kwargs.get("constraints") is not None:
        options["constraints"] = [str(c) for c in kwargs["constraints"]]
    if kwargs.get("unchecked"):
        options["unchecked"] = True
    return options


def model_bundle(
    model: onnx.ModelProto, name: str, what: str, store: Store | None, workdir: Path, options: Mapping[str, Any] | None = None
) -> tuple[LoadedBundle, str]:
    """The model's bundle, loaded, and where it came from ("cache" or "built"): the one an earlier
    `prepare` kept in the cache for the same model bytes and build options (`bundle_key`), else one
    built now (in `workdir`) and kept there. A kept bundle the loader refuses is removed and built
    anew; a model whose weights are left in external data files is always built. `options`: the
    manifest entries for its shapes (`shape_options`)."""
    places = store if store is not None else default_store()
    options = dict(options or {})
    key = None if has_external_data(model) else bundle_key(model.SerializeToString(deterministic=True), {"name": name, **options})
    if key is not None:
        found = cached_bundle(places, key)
        if found is not None:
            return found, "cache"
    with places.lock(f"onnx-{key}") if key is not None else nullcontext():
        if key is not None:
            found = cached_bundle(places, key)  # built by another process while this one waited
            if found is not None:
                return found, "cache"
        (workdir / "model.onnx").write_bytes(as_kernel(model, name).SerializeToString())
        entry = "".join(f"    {key}: {json.dumps(value)}\n" for key, value in options.items())
        (workdir / "manifest.yaml").write_text(f"bundle: {name}\nkernels:\n  - name: {name}\n    source: model.onnx\n{entry}")
        notes = build_isolated(workdir / "manifest.yaml", workdir / "model.pkb", what, str(workdir / "model.onnx"))
        kept = keep_bundle(places, key, workdir / "model.pkb", notes) if key is not None else None
        return load(kept or workdir / "model.pkb", store=places), "built"


@functools.lru_cache(maxsize=1)
def producer_digest() -> str:
    """What a bundle `prepare` builds depends on besides the model and its options: portkern's
    release and build code (`portkern.portable`), the IREE compiler and the onnx package."""
    import portkern
    import portkern.portable

    compiler = installed_compiler()
    digest = hashlib.sha256(json.dumps([portkern.__version__, compiler.version, compiler.revision, onnx.__version__]).encode())
    for source in sorted(Path(portkern.portable.__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()


def bundle_key(model_bytes: bytes, options: Mapping[str, Any]) -> str:
    """The name a bundle built from serialized model bytes with the build options that shape it
    is kept under: a SHA-256 digest of both and of `producer_digest`."""
    digest = hashlib.sha256(f"portkern-onnx-bundle\0{producer_digest()}\0{json.dumps(options, sort_keys=True)}\0".encode())
    digest.update(model_bytes)
    return digest.hexdigest()


def bundle_dirs(store: Store) -> tuple[list[Path], Path | None]:
    """The folders kept bundles are looked up in (each usable cache directory's `bundles/`, in
    lookup order) and the one new ones go to (None when no cache directory is writable)."""
    usable = [place for place in store.places() if place["state"] != "not usable"]
    writable = next((Path(p["directory"]) / BUNDLES for p in usable if p["state"] == "writable"), None)
    return [Path(p["directory"]) / BUNDLES for p in usable], writable


#: The largest build-notes file kept beside a bundle that is read (bytes).
NOTES_LIMIT = 1 << 20


def cached_bundle(store: Store, key: str) -> LoadedBundle | None:
    """The kept bundle named `key`, loaded (its build's warnings shown again), or None. One the
    loader refuses is removed where this process may."""
    for folder in bundle_dirs(store)[0]:
        path = folder / f"{key}.pkb"
        if not path.is_file():
            continue
        try:
            bundle = load(path, store=store)
        except BundleError as exc:
            log.warning("a kept ONNX bundle was refused and is built anew (%s)", errors.brief(str(exc)))
            for stale in (path, path.with_suffix(".json")):
                try:
                    stale.unlink()
                except OSError:
                    pass
            continue
        try:  # (a regular file of bounded size: a named pipe or a huge file there is passed over)
            notes = json.loads(read_bounded(path.with_suffix(".json"), NOTES_LIMIT, "kept build notes", OSError, regular=True)).get("warnings") or []
        except (OSError, ValueError, AttributeError):
            notes = []
        for note in notes:
            warnings.warn(str(note), stacklevel=4)
        return bundle
    return None


def keep_bundle(store: Store, key: str, built: Path, notes: Sequence[str]) -> Path | None:
    """Keep a bundle just built (and its build's warnings) as `<key>.pkb` in the writable cache
    directory's `bundles/`; each file appears whole or not at all. Its path, or None when it
    could not be kept (no writable cache directory, a full disk)."""
    folder = bundle_dirs(store)[1]
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _sweep_parts(folder)
        _write_whole(folder / f"{key}.json", json.dumps({"warnings": list(notes)}).encode())
        target = folder / f"{key}.pkb"
        _write_whole(target, built)
        return target
    except OSError as exc:
        log.warning("the ONNX model's bundle is not kept in %s (%s); the next prepare builds it again", folder, exc.strerror or exc)
        return None


def _write_whole(path: Path, data: bytes | Path) -> None:
    """Write `data` (bytes, or a file's contents) to `path`, which readers see whole or not at all."""
    part = part_path(path)
    try:
        with open(part, "wb") as file:
            if isinstance(data, Path):
                with open(data, "rb") as source:
                    shutil.copyfileobj(source, file, 1 << 20)
            else:
                file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(part, path)
    except BaseException:
        try:
            part.unlink()
        except OSError:
            pass
        raise


def _sweep_parts(folder: Path) -> None:
    """Remove the partial files of processes that were stopped while writing one."""
    for part in folder.glob(".*.part"):
        if stale_part(part.name):
            try:
                part.unlink()
            except OSError:
                pass


def build_isolated(manifest: Path, output: Path, what: str, source: str) -> list[str]:
    """`portkern build` in a worker of the shared pool (kept alive between models): the IREE
    compiler lowers the model there, so that a compiler crash is a BuildError, not the end of the
    caller's process. The build's warnings, shown and returned."""
    result = shared_pool().run([Job.build(0, what, str(manifest), str(output), BUILD_TIMEOUT_S)])[0]
    notes = [str(note).replace(source, what) for note in result.data.get("warnings") or ()]
    for note in notes:
        warnings.warn(note, stacklevel=4)
    if result.ok:
        return notes
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
    except (AttributeError, ValueError):  # onnx's Device: an unknown type name, a device id that is not a number
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
