"""Architectures from the libraries people use, with random weights, exported the three ways users
export them, built through portkern and compared with PyTorch's eager output.

    python bench/export_corpus.py [--models bert,gpt2,resnet18,mobilenet,mobilenetv3,vit] [--routes onnx-ts,onnx-dynamo,pt2]
                                  [--intake manifest,prepare] [--timeout S] [--json [FILE]]

Models (seeded random weights, eval mode; transformers' definitions unless said):
`bert` BertModel at MiniLM sizes (hidden 384, 12 heads, intermediate 1536, 2 layers; 1x128 tokens),
`gpt2` GPT2Model with 2 layers (n_embd 768, 12 heads, vocabulary 8192; 1x64 tokens),
`resnet18` ResNetModel at ResNet-18's shape (basic blocks, depths 2-2-2-2, widths 64-512; 1x3x224x224),
`mobilenet` MobileNetV2Model (1x3x224x224), `mobilenetv3` MobileNetV3-Small as torchvision defines it,
in plain PyTorch here (`mobilenet_v3`; 1x3x224x224), `vit` ViTModel at ViT-Tiny sizes (hidden 192,
3 heads, 2 layers, patch 16; 1x3x224x224); `bert-tiny`, `gpt2-tiny` (hidden 64, 2 layers, 32 tokens),
`resnet-tiny` (basic blocks, depths 1-1, widths 16-32; 1x3x32x32) and `mobilenetv3-tiny` (three
blocks; 1x3x32x32) are the quick ones CI samples. The MobileNets' batch norms hold the statistics
of random inputs (`calibrated`). torchvision is not used: its only wheel for torch 2.13 here is the
CUDA build, which does not import beside the `+cpu` torch (`operator torchvision::nms does not
exist`); transformers has no MobileNetV3. GPT-2 is built with `use_cache=False` (its default returns
a `DynamicCache`, which no exporter route here takes as an output).

Routes, each the exporter's default settings: `onnx-ts` (`torch.onnx.export(..., dynamo=False)`,
TorchScript; BERT and GPT-2 through a module that calls them by keyword, `by_keyword`), `onnx-dynamo`
(`torch.onnx.export(..., dynamo=True)`, onnxscript; writes
`model.onnx` + `model.onnx.data`), `pt2` (`torch.export.export` + `torch.export.save`).
Intake: `manifest` (a manifest naming the file, `portkern build`, `portkern.load`, the kernel called)
and, for the ONNX routes, `prepare` (`portkern.onnx.prepare(onnx.load(path), "CPU")`).

Each model x route x intake runs in a fresh process with a fresh cache directory; every output
(the model's outputs in order, as `ModelOutput.to_tuple()` gives them) is compared with eager
PyTorch at rtol 1e-4, atol 1e-4 times the output's largest magnitude where that is above 1. Prints one row each (built, correct, max error, build seconds,
the one-line error when refused or wrong). Exit status 1 when a row is not correct.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MODELS = ("bert", "gpt2", "resnet18", "mobilenet", "mobilenetv3", "vit", "bert-tiny", "gpt2-tiny", "resnet-tiny", "mobilenetv3-tiny")
DEFAULT_MODELS = ("bert", "gpt2", "resnet18", "mobilenet", "mobilenetv3", "vit")
ROUTES = ("onnx-ts", "onnx-dynamo", "pt2")
INTAKES = ("manifest", "prepare")
RTOL = ATOL = 1e-4
SEED = 0


@dataclass
class Row:
    model: str
    route: str
    intake: str
    built: bool
    correct: bool
    max_error: float | None
    build_s: float | None
    reason: str


def make(name: str):
    """The model `name` (seeded random weights, eval mode) and its example inputs (a tuple)."""
    import torch
    import transformers as tf

    torch.manual_seed(SEED)
    if name.startswith("bert"):
        tiny = name == "bert-tiny"
        config = tf.BertConfig(
            vocab_size=30522 if not tiny else 1000, hidden_size=64 if tiny else 384, num_hidden_layers=2,
            num_attention_heads=4 if tiny else 12, intermediate_size=256 if tiny else 1536,
        )
        model, tokens = tf.BertModel(config), 32 if tiny else 128
        inputs: tuple = (torch.randint(0, config.vocab_size, (1, tokens)),)
    elif name.startswith("gpt2"):
        tiny = name == "gpt2-tiny"
        config = tf.GPT2Config(
            vocab_size=1000 if tiny else 8192, n_positions=128, n_embd=64 if tiny else 768, n_layer=2, n_head=4 if tiny else 12, use_cache=False,
        )
        model, tokens = tf.GPT2Model(config), 32 if tiny else 64
        inputs = (torch.randint(0, config.vocab_size, (1, tokens)),)
    elif name == "resnet18":
        config = tf.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], embedding_size=64)
        model, inputs = tf.ResNetModel(config), (torch.randn(1, 3, 224, 224),)
    elif name == "resnet-tiny":
        config = tf.ResNetConfig(layer_type="basic", depths=[1, 1], hidden_sizes=[16, 32], embedding_size=16)
        model, inputs = tf.ResNetModel(config), (torch.randn(1, 3, 32, 32),)
    elif name == "mobilenet":
        inputs = (torch.randn(1, 3, 224, 224),)
        model = calibrated(tf.MobileNetV2Model(tf.MobileNetV2Config()), inputs[0])
    elif name == "mobilenetv3":
        inputs = (torch.randn(1, 3, 224, 224),)
        model = calibrated(mobilenet_v3(MOBILENET_V3_SMALL), inputs[0])
    elif name == "mobilenetv3-tiny":
        inputs = (torch.randn(1, 3, 32, 32),)
        model = calibrated(mobilenet_v3(MOBILENET_V3_TINY, classes=10, last=64), inputs[0])
    elif name == "vit":
        config = tf.ViTConfig(hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768)
        model, inputs = tf.ViTModel(config), (torch.randn(1, 3, 224, 224),)
    else:
        raise ValueError(f"unknown model {name!r}")
    return model.eval(), inputs


#: MobileNetV3-Small's blocks as published (Howard et al. 2019, table 2; torchvision's
#: `mobilenet_v3_small`): kernel, expanded width, output width, squeeze-excitation, hardswish, stride.
MOBILENET_V3_SMALL = (
    (3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1),
)
#: A three-block variant with each kind of block (squeeze-excitation, hardswish, a residual).
MOBILENET_V3_TINY = ((3, 16, 16, True, False, 2), (3, 48, 24, False, False, 2), (5, 72, 24, True, True, 1))


def mobilenet_v3(blocks: tuple, classes: int = 1000, last: int = 1024):
    """MobileNetV3 in plain PyTorch, as torchvision defines it (`torchvision.models.mobilenetv3`):
    a hardswish stem, inverted residual blocks (1x1 expansion, depthwise kxk, squeeze-excitation
    with a hardsigmoid gate, 1x1 projection; a residual where the shape allows), a 1x1 conv to six
    times the last width, global average pooling and a hardswish classifier; batch norm eps 0.001;
    torchvision's initialisation."""
    from torch import nn

    def divisible(v: float, divisor: int = 8) -> int:
        rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
        return rounded + divisor if rounded < 0.9 * v else rounded

    def conv(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1, act=None) -> nn.Sequential:
        layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout, eps=0.001, momentum=0.01)]
        return nn.Sequential(*layers, *([act()] if act else []))

    class SqueezeExcitation(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            squeezed = divisible(width // 4)
            self.fc1, self.fc2 = nn.Conv2d(width, squeezed, 1), nn.Conv2d(squeezed, width, 1)
            self.relu, self.gate = nn.ReLU(), nn.Hardsigmoid()

        def forward(self, x):
            scale = x.mean((2, 3), keepdim=True)
            return x * self.gate(self.fc2(self.relu(self.fc1(scale))))

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, hardswish: bool, stride: int) -> None:
            super().__init__()
            act = nn.Hardswish if hardswish else nn.ReLU
            layers = [conv(cin, expanded, act=act)] if expanded != cin else []
            layers.append(conv(expanded, expanded, kernel, stride, groups=expanded, act=act))
            layers += [SqueezeExcitation(expanded)] if se else []
            layers.append(conv(expanded, cout))
            self.block, self.residual = nn.Sequential(*layers), stride == 1 and cin == cout

        def forward(self, x):
            y = self.block(x)
            return x + y if self.residual else y

    class MobileNetV3(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            width, layers = blocks[0][1], [conv(3, blocks[0][1], 3, 2, act=nn.Hardswish)]
            for kernel, expanded, cout, se, hardswish, stride in blocks:
                layers.append(InvertedResidual(width, kernel, expanded, cout, se, hardswish, stride))
                width = cout
            layers.append(conv(width, 6 * width, act=nn.Hardswish))
            self.features, self.pool = nn.Sequential(*layers), nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Linear(6 * width, last), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(last, classes))
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out")
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0, 0.01)
                    nn.init.zeros_(m.bias)

        def forward(self, x):
            return self.classifier(self.pool(self.features(x)).flatten(1))

    return MobileNetV3()


def calibrated(model, example):
    """`model` with each batch norm's running statistics those of 8 random inputs shaped like
    `example`, as training leaves them: with their initial statistics (mean 0, variance 1) the
    activations of MobileNet's many normalised layers shrink towards 0 and outputs end near 1e-9
    (MobileNetV2 near 1e-21), where an absolute tolerance says nothing."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average: one batch's statistics
    model.train()
    with torch.no_grad():
        model(torch.randn(8, *example.shape[1:]))
    for m in norms:
        m.momentum = 0.1
    return model


def flat(outputs) -> list:
    """The model's outputs in order, as NumPy arrays (`ModelOutput.to_tuple()`, a tuple, or one tensor)."""
    if hasattr(outputs, "to_tuple"):
        outputs = outputs.to_tuple()
    if not isinstance(outputs, (tuple, list)):
        outputs = (outputs,)
    return [o.detach().numpy() for o in outputs]


def by_keyword(model, inputs: tuple) -> tuple:
    """What the TorchScript exporter is given for a transformers model whose `forward` takes
    `use_cache` (BERT, GPT-2), as users export one, and its example inputs: a module that calls it
    by keyword and returns its outputs as a tuple. Given the model itself, the exporter passes every
    positional parameter (`use_cache=None` among them) and transformers 5's
    `merge_with_config_defaults` adds `use_cache` from the config as a keyword as well: `TypeError:
    forward() got multiple values for argument 'use_cache'`. GPT-2 is also given the all-ones
    `attention_mask` a tokenizer gives an unpadded batch: without one, transformers' causal mask
    looks for packed sequences with `torch.diff`, which the TorchScript exporter has no symbolic for
    (`UnsupportedOperatorError: Exporting the operator 'aten::diff' to ONNX opset version 20`)."""
    import torch

    names = ("input_ids", "attention_mask") if type(model).__name__ == "GPT2Model" else ("input_ids",)

    class ByKeyword(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return self.model(**dict(zip(names, tensors))).to_tuple()

    return ByKeyword().eval(), inputs + tuple(torch.ones_like(inputs[0]) for _ in names[len(inputs):])


def export(model, inputs: tuple, route: str, where: Path) -> tuple[Path, tuple]:
    """The model exported the `route` way, with the exporter's default settings, under `where`,
    and the inputs the exported program takes."""
    import inspect

    import torch

    if route == "pt2":
        path = where / "model.pt2"
        torch.export.save(torch.export.export(model, inputs), str(path))
    else:
        path = where / "model.onnx"
        if route == "onnx-ts" and "use_cache" in inspect.signature(model.forward).parameters:
            model, inputs = by_keyword(model, inputs)
        torch.onnx.export(model, inputs, str(path), dynamo=route == "onnx-dynamo")
    return path, inputs


def one(name: str, route: str, intake: str, work: Path) -> dict:
    """One model, route and intake in this process (the child side of `run`)."""
    import numpy as np
    import torch

    import portkern
    from portkern.base.errors import PortkernError, one_line

    def refused(reason: str, built: bool = False, build_s: float | None = None) -> dict:
        return {"built": built, "correct": False, "max_error": None, "build_s": build_s, "reason": reason}

    model, inputs = make(name)
    with torch.no_grad():
        want = flat(model(*inputs))
    try:
        path, inputs = export(model, inputs, route, work)
    except Exception as exc:  # noqa: BLE001 - the exporter's own failure is a row of the table
        return refused(f"export failed: {type(exc).__name__}: {one_line(str(exc), limit=240)}")
    arrays = [i.numpy() for i in inputs]
    start = time.monotonic()
    if intake == "prepare":
        import onnx

        from portkern import onnx as backend

        try:
            rep = backend.prepare(onnx.load(str(path)), "CPU")
        except PortkernError as exc:
            return refused(f"{type(exc).__name__}: {one_line(str(exc), limit=400)}", build_s=time.monotonic() - start)
        build_s = time.monotonic() - start
        call = lambda *arrays: rep.run(list(arrays))  # noqa: E731 - the backend takes the inputs as one list
    else:
        manifest = work / "m.yaml"
        manifest.write_text(f"bundle: corpus\nkernels:\n  - name: model\n    source: {json.dumps(str(path))}\n")
        cli = Path(sys.executable).with_name("portkern")
        done = subprocess.run([str(cli), "build", str(manifest), "-o", str(work / "m.pkb")], capture_output=True, text=True)
        build_s = time.monotonic() - start
        if done.returncode:
            return refused(one_line(done.stderr or f"exit {done.returncode}", limit=400), build_s=build_s)
        try:
            call = portkern.load(work / "m.pkb").kernel("model", device="cpu")
        except PortkernError as exc:
            return refused(f"{type(exc).__name__}: {one_line(str(exc), limit=400)}", True, build_s)
    try:
        got = call(*arrays)
    except PortkernError as exc:
        return refused(f"{type(exc).__name__}: {one_line(str(exc), limit=400)}", True, build_s)
    got = list(got) if isinstance(got, tuple) else [got]
    if len(got) != len(want):
        return refused(f"{len(got)} outputs, eager PyTorch gives {len(want)}", True, build_s)
    worst, reason = 0.0, ""
    for index, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape or g.dtype != w.dtype:
            return refused(f"output {index}: {g.dtype}{list(g.shape)}, eager PyTorch gives {w.dtype}{list(w.shape)}", True, build_s)
        error = float(np.max(np.abs(g.astype(np.float64) - w))) if g.size else 0.0
        worst = max(worst, error)
        atol = ATOL * max(1.0, float(np.max(np.abs(w))) if w.size else 0.0)  # of the output's scale beyond 1
        if not reason and not np.allclose(g, w, rtol=RTOL, atol=atol):
            reason = f"output {index}: max error {error:.3g} beyond rtol {RTOL}, atol {atol:.3g}"
    return {"built": True, "correct": not reason, "max_error": worst, "build_s": build_s, "reason": reason}


def run(name: str, route: str, intake: str, timeout_s: float) -> Row:
    """One model, route and intake in a fresh process with a fresh cache directory."""
    with tempfile.TemporaryDirectory(prefix="portkern-export-") as tmp:
        env = dict(os.environ, PORTKERN_CACHE_DIR=str(Path(tmp) / "cache"))
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--child", name, route, intake, tmp],
                capture_output=True, text=True, env=env, timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return Row(name, route, intake, False, False, None, None, f"no result within {timeout_s:.0f} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return Row(name, route, intake, False, False, None, None, f"the process ended without a result ({tail[:240]})")
    return Row(name, route, intake, **json.loads(lines[-1][len("RESULT "):]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        name, route, intake, work = argv[1:5]
        print("RESULT " + json.dumps(one(name, route, intake, Path(work))), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--intake", default="manifest", help="manifest, prepare, or both (prepare only for ONNX routes)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds one row may take")
    parser.add_argument("--json", nargs="?", const="-", default=None, help="the rows as JSON, to FILE or (no FILE) stdout")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    routes = [r for r in args.routes.split(",") if r]
    intakes = [i for i in args.intake.split(",") if i]
    unknown = [m for m in models if m not in MODELS] + [r for r in routes if r not in ROUTES] + [i for i in intakes if i not in INTAKES]
    if unknown:
        parser.error(f"unknown model, route or intake: {', '.join(unknown)}")
    work = [(m, r, i) for m in models for r in routes for i in intakes if not (i == "prepare" and r == "pt2")]
    quiet = args.json == "-"
    if not quiet:
        print(f"{'model':<10} {'route':<12} {'intake':<9} {'built':<6} {'correct':<8} {'max error':>10} {'build s':>8}  reason", flush=True)
    rows = []
    try:
        for item in work:
            row = run(*item, args.timeout)
            rows.append(row)
            if not quiet:
                error = "-" if row.max_error is None else f"{row.max_error:.2g}"
                seconds = "-" if row.build_s is None else f"{row.build_s:.0f}"
                print(
                    f"{row.model:<10} {row.route:<12} {row.intake:<9} {'yes' if row.built else 'no':<6} "
                    f"{'yes' if row.correct else 'no':<8} {error:>10} {seconds:>8}  {row.reason[:300]}",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("interrupted: the tally covers the rows above", flush=True)
    if quiet:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        print(f"\ncorrect {sum(r.correct for r in rows)}/{len(rows)}, built {sum(r.built for r in rows)}/{len(rows)}")
        if args.json:
            Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0 if rows and all(r.correct for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
