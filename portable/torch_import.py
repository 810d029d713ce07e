"""PyTorch programs (`torch.export.save`'s `.pt2`) to MLIR with their weights as named parameters.

The import runs in its own process (`python -m portkern.portable.torch_import MODEL OUT`),
which needs torch and iree-turbine (`pip install 'portkern[torch]'`); the build process and
the device need neither. It loads the ExportedProgram (an output type it names, such as
transformers' `ModelOutput` classes, registered by importing the module that defines it),
decomposes it as iree-turbine decomposes a module it exports itself, rewrites the boolean ops IREE's
torch input conversion does not take (an all-true fill `&`-ed into a mask, `aten.__and__`), marks every tensor of its state
(parameters, buffers, constants) as an external parameter `"model"::<state-dict name>`,
exports it with iree-turbine (dynamic dimensions kept; the entry's arguments named as the
program's user inputs, `x`), and writes `model.mlir`,
`weights.bin` (the tensors' raw bytes, one after another) and `weights.json` (name, offset,
size of each). The builder streams the bytes of the referenced ones into the bundle.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from portkern.base.errors import BuildError, brief, one_line
from portkern.portable.parameters import DEFAULT_SCOPE, MAX_SECTION_BYTES, ParameterData, file_pieces, referenced

TORCH_IMPORT_TIMEOUT_S = 1800
#: The index of the written weights is bounded like a bundle's parameter list.
MAX_INDEX_BYTES = 64 << 20


def import_torch(path: Path, kernel: str, workdir: Path) -> tuple[bytes, tuple[ParameterData, ...]]:
    """MLIR text for a `.pt2` program and readers of the weights it refers to (files under
    `workdir`, which must outlive the readers)."""
    out = Path(tempfile.mkdtemp(prefix="torch-", dir=workdir))
    cmd = [sys.executable, "-m", "portkern.portable.torch_import", str(path), str(out)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TORCH_IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{path}: PyTorch import took longer than {TORCH_IMPORT_TIMEOUT_S} s") from None
    if done.returncode != 0:
        message = brief(done.stderr, last=True) or "no message"
        if "No module named 'torch'" in message or "No module named 'iree.turbine'" in message:
            raise BuildError(f"{path}: PyTorch programs need torch and iree-turbine on the build host (pip install 'portkern[torch]')")
        raise BuildError(f"{path}: PyTorch import failed: {message}")
    text = (out / "model.mlir").read_bytes()
    try:
        index = json.loads((out / "weights.json").read_text()[:MAX_INDEX_BYTES])
        entries = {e["name"]: (int(e["offset"]), int(e["size"])) for e in index}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BuildError(f"{path}: PyTorch import wrote no readable weight index ({exc})") from None
    data = []
    for scope, name in referenced(text):
        if name not in entries:
            raise BuildError(f"{path}: the exported program refers to parameter {name!r}, which it does not hold")
        offset, size = entries[name]
        data.append(ParameterData(kernel, scope, name, size, file_pieces(out / "weights.bin", offset, size)))
    return text, tuple(data)


#: aten ops (their default overloads) taken apart with torch's core decompositions before import:
#: iree-turbine's importer has no lowering for them (aten.diff: transformers' attention masks).
_FROM_CORE = ("diff",)

#: aten ops that make a tensor of one value -> where that value is: ("value", it) or ("arg", its index).
#: A boolean one imports as an i1 `torch.vtensor.literal`, which IREE's torch input conversion does
#: not legalize; transformers' causal masks start from `new_ones(..., dtype=torch.bool)` and `&` it
#: with the comparisons that make the mask.
_FILLS: dict[str, tuple[str, Any]] = {
    "new_ones": ("value", True), "ones": ("value", True), "new_zeros": ("value", False), "zeros": ("value", False),
    "full": ("arg", 1), "new_full": ("arg", 2), "scalar_tensor": ("arg", 0),
}
#: Boolean ops `x (op) fill` that give `x` where the fill is all this value and `x` has the result's shape.
_IDENTITIES = {
    "__and__.Tensor": True, "bitwise_and.Tensor": True, "logical_and.default": True,
    "__or__.Tensor": False, "bitwise_or.Tensor": False, "logical_or.default": False,
}
#: aten ops IREE's torch input conversion does not legalize -> the op they are (same overloads).
_RENAMED = {"__and__": "bitwise_and", "__or__": "bitwise_or", "__xor__": "bitwise_xor"}

#: torch.export.load's message for an output type whose pytree registration is not in this process.
_UNREGISTERED = re.compile(r"Deserializing (\S+) in pytree is not registered")


class _Causes(logging.Handler):
    """The exceptions torch.export.load logs (and replaces by a message that points at them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.found: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.found.append(record.exc_info[1])


#: Packages whose output types register themselves with torch's pytree when their module is
#: imported; a module a `.pt2` names is imported only inside these (a file names no other code to run).
PYTREE_OWNERS = ("transformers", "diffusers")


def _import_owner(type_name: str) -> bool:
    """Import the module that defines `type_name` (a dotted class name), as the process that saved
    the program had it imported (transformers' ModelOutput classes register themselves with
    torch's pytree when defined), when it belongs to a package of `PYTREE_OWNERS`; whether one
    was imported."""
    parts = type_name.split(".")
    if parts[0] not in PYTREE_OWNERS or not all(part.isidentifier() for part in parts):
        return False
    for end in range(len(parts) - 1, 0, -1):
        try:
            importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        return True
    return False


def _load(model: Path) -> Any:
    """The ExportedProgram in `model`. An output type the file names but this process has not
    registered is registered by importing its module; any other failure ends the process with
    torch's own cause as the last line (torch.export.load only logs it)."""
    import torch

    logger = logging.getLogger("torch.export")
    tried: set[str] = set()
    while True:
        causes = _Causes()
        logger.addHandler(causes)
        try:
            return torch.export.load(str(model))
        except RuntimeError as exc:
            cause = causes.found[-1] if causes.found else exc
            unregistered = _UNREGISTERED.search(str(cause))
            if unregistered is None or unregistered.group(1) in tried or not _import_owner(unregistered.group(1)):
                raise SystemExit(f"{type(cause).__name__}: {one_line(str(cause), limit=400)}") from None
            tried.add(unregistered.group(1))
        finally:
            logger.removeHandler(causes)


def _fold_boolean_fills(program: Any) -> int:
    """Take out of `program`'s graph, in place, each use of a boolean fill (`_FILLS`) that leaves
    the other operand as it is (`_IDENTITIES`: `all-true & x` is `x`), and the fill when nothing
    else uses it; how many uses were taken out."""
    import torch

    aten = torch.ops.aten
    fills = {getattr(getattr(aten, name), o): where for name, where in _FILLS.items() for o in getattr(aten, name).overloads()}
    identities = {getattr(getattr(aten, op.split(".")[0]), op.split(".")[1]): keeps for op, keeps in _IDENTITIES.items()}

    def fill_value(node: Any) -> bool | None:
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if node.op != "call_function" or node.target not in fills or not isinstance(value, torch.Tensor) or value.dtype != torch.bool:
            return None
        kind, where = fills[node.target]
        if kind == "value":
            return bool(where)
        held = node.args[where] if len(node.args) > where else None
        return bool(held) if isinstance(held, (bool, int, float)) else None

    graph = program.graph_module.graph
    folded = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in identities or len(node.args) != 2:
            continue
        result = node.meta.get("val")
        for fill, other in (node.args, node.args[::-1]):
            kept = other.meta.get("val") if isinstance(other, torch.fx.Node) else None
            if (
                isinstance(fill, torch.fx.Node) and fill_value(fill) is identities[node.target]
                and isinstance(kept, torch.Tensor) and isinstance(result, torch.Tensor)
                and kept.dtype == result.dtype == torch.bool and kept.shape == result.shape
            ):
                node.replace_all_uses_with(other)
                graph.erase_node(node)
                if not fill.users:
                    graph.erase_node(fill)
                folded += 1
                break
    return folded


def _rename(program: Any) -> int:
    """Call each op of `_RENAMED` in `program`'s graph by the name IREE takes, in place; how many."""
    import torch

    aten = torch.ops.aten
    renamed = {
        getattr(getattr(aten, old), o): getattr(getattr(aten, new), o)
        for old, new in _RENAMED.items() for o in getattr(aten, old).overloads() if o in getattr(aten, new).overloads()
    }
    count = 0
    for node in program.graph_module.graph.nodes:
        if node.op == "call_function" and node.target in renamed:
            node.target = renamed[node.target]
            count += 1
    return count


def _export(model: Path, out: Path) -> None:
    """In the import process: export the program and write its MLIR and weights."""
    import torch
    from iree.turbine import aot
    from iree.turbine.aot import ExternalTensorTrait, current_aot_decompositions

    # The decompositions iree-turbine applies to a module it exports itself, which it leaves out
    # for a program exported beforehand: they functionalise in-place ops (ReLU(inplace=True)) and
    # take list-returning ops (aten.split) and batch norm to ops its importer takes. Plus the
    # ops of _FROM_CORE, which neither its table nor its importer handles, as torch decomposes them.
    table = dict(current_aot_decompositions())
    core = torch.export.default_decompositions()
    table.update({op: core[op] for op in (getattr(torch.ops.aten, name).default for name in _FROM_CORE) if op in core})
    program = _load(model).run_decompositions(table)
    if _fold_boolean_fills(program) + _rename(program):
        program.graph_module.graph.lint()
        program.graph_module.recompile()
    tensors = {**program.state_dict, **program.constants}
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor):
            ExternalTensorTrait(external_scope=DEFAULT_SCOPE, external_name=name).set(tensor)
    exported = aot.export(program)
    exported.save_mlir(str(out / "model.mlir"))
    user_inputs = list(program.graph_signature.user_inputs)
    text = (out / "model.mlir").read_text()
    (out / "model.mlir").write_text(name_arguments(text, "main", [n if isinstance(n, str) else "" for n in user_inputs]))
    index, offset = [], 0
    with open(out / "weights.bin", "wb") as f:
        for name, tensor in tensors.items():
            if not isinstance(tensor, torch.Tensor):
                continue
            raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
            if offset + raw.nbytes > MAX_SECTION_BYTES:
                raise SystemExit("the program's weights are larger than a bundle holds")
            f.write(raw.tobytes())
            index.append({"name": name, "offset": offset, "size": int(raw.nbytes)})
            offset += raw.nbytes
    (out / "weights.json").write_text(json.dumps(index))


#: An MLIR value name the builder reads as an argument's name (`contract_ir.argument_names`).
_VALUE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$.]{0,127}$")
#: What may continue an MLIR value name (a reference `%arg1` is not a prefix of `%arg10`).
_NAME_GOES_ON = r"(?![A-Za-z0-9_$.\-])"


def name_arguments(text: str, entry: str, names: list[str]) -> str:
    """`text` with the arguments of its function `entry` (`%arg0`, ... as MLIR prints them) called
    by `names`, the program's user inputs (its forward parameters: `x`), so that the kernel's
    contract names them; `text` as it is when the names are not one per argument, are not
    plain value names, or one is a name `entry` already uses (torch-mlir's `%none`, `%int1`)."""
    header = re.search(rf"func\.func @{re.escape(entry)}\(", text)
    if header is None or not names or len(set(names)) != len(names) or not all(_VALUE_NAME.match(n) for n in names):
        return text
    end = re.compile(r"^  }$", re.M).search(text, header.end())
    start, stop = header.start(), end.end() if end else len(text)
    body = text[start:stop]
    count = len(re.findall(rf"%arg\d+{_NAME_GOES_ON}\s*:", body[: body.find(")")]))
    if count != len(names) or any(n != f"arg{i}" and re.search(rf"%{re.escape(n)}{_NAME_GOES_ON}", body) for i, n in enumerate(names)):
        return text
    for index, name in enumerate(names):
        body = re.sub(rf"%arg{index}{_NAME_GOES_ON}", f"%{name}", body)
    return text[:start] + body + text[stop:]


def remove(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _export(Path(sys.argv[1]), Path(sys.argv[2]))
