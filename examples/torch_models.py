"""PyTorch example programs, exported to `.pt2` files for `kind: torch` kernels (needs torch).

    python -m portkern.examples.torch_models OUT_DIR     # writes block.pt2, cnn.pt2, manifest.yaml

`block`: a transformer encoder layer (8-head attention, layer norm, softmax, a 512-wide feed
forward) on 8x128 tokens of width 256. `cnn`: two 3x3 convolutions with batch norm and GELU,
global average pooling and a linear classifier, on 4 RGB images of 32x32. Weights are seeded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

SEED = 0
MODELS = {"block": (8, 128, 256), "cnn": (4, 3, 32, 32)}


class Cnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.norm(self.conv1(x)))
        h = torch.nn.functional.gelu(self.conv2(h))
        return self.fc(h.mean((2, 3)))


def model(name: str) -> torch.nn.Module:
    """The seeded example model, in eval mode."""
    torch.manual_seed(SEED)
    if name == "block":
        return torch.nn.TransformerEncoderLayer(256, 8, dim_feedforward=512, batch_first=True).eval()
    return Cnn().eval()


def example_input(name: str, seed: int = 0) -> torch.Tensor:
    return torch.randn(*MODELS[name], generator=torch.Generator().manual_seed(seed))


def export_all(out: Path) -> Path:
    """Write every model as `<name>.pt2` and a manifest naming them; return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for name in MODELS:
        with torch.no_grad():
            program = torch.export.export(model(name), (example_input(name),))
        torch.export.save(program, str(out / f"{name}.pt2"))
        entries.append(f"  - name: {name}\n    source: {name}.pt2\n")
    manifest = out / "manifest.yaml"
    manifest.write_text("bundle: torch_examples\nkernels:\n" + "".join(entries))
    return manifest


if __name__ == "__main__":
    print(export_all(Path(sys.argv[1])))
