"""PyTorch programs (`torch.export.save`'s `.pt2`) to MLIR with their weights as named parameters.

The import runs in its own process (`python -m portkern.portable.torch_import MODEL OUT`),
which needs torch and iree-turbine (`pip install 'portkern[torch]'`); the build process and
the device need neither. It loads the ExportedProgram, marks every tensor of its state
(parameters, buffers, constants) as an external parameter `"model"::<state-dict name>`,
exports it with iree-turbine (dynamic dimensions kept), and writes `model.mlir`,
`weights.bin` (the tensors' raw bytes, one after another) and `weights.json` (name, offset,
size of each). The builder streams the bytes of the referenced ones into the bundle.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from portkern.base.errors import BuildError, brief
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


def _export(model: Path, out: Path) -> None:
    """In the import process: export the program and write its MLIR and weights."""
    import torch
    from iree.turbine import aot
    from iree.turbine.aot import ExternalTensorTrait

    program = torch.export.load(str(model))
    tensors = {**program.state_dict, **program.constants}
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor):
            ExternalTensorTrait(external_scope=DEFAULT_SCOPE, external_name=name).set(tensor)
    exported = aot.export(program)
    exported.save_mlir(str(out / "model.mlir"))
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


def remove(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _export(Path(sys.argv[1]), Path(sys.argv[2]))
