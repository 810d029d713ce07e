"""A bundle changed on disk while a process has it loaded: the process gets the loaded bundle's
results or `BundleChangedError`, never other numbers and never a signal (docs/bundle-format.md,
"A bundle in use"). Each change is made while a child process holds the bundle; the child
must survive it."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")

from helpers import one_kernel_bundle

import portkern  # noqa: E402
from portkern.base.errors import BundleChangedError  # noqa: E402
from portkern.examples.large_mlp import reference, write_mlp  # noqa: E402
from portkern.jit.parameters import READ_LIMIT  # noqa: E402

#: A file of at most READ_LIMIT bytes is read into memory whole; a larger one is mapped.
SIZES = {"read": (64, 512, 256, 256), "mapped": (64, math.isqrt(READ_LIMIT // 4) + 64, math.isqrt(READ_LIMIT // 4) + 64, 64)}
BATCH = 8
RTOL, ATOL = 1e-4, 1e-4

#: Loads the bundle, calls the kernel, waits for a line (the seed of the bundle now at the path,
#: 0: none), calls again; a typed error is followed by a fresh load of what is at the path now.
CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import portkern
    from portkern.examples.large_mlp import reference

    path, widths = sys.argv[1], tuple(int(w) for w in sys.argv[2].split(","))
    x = np.random.default_rng(0).standard_normal((8, widths[0]), dtype=np.float32)

    def outcome(kernel, seed):
        result = kernel(x)
        return {"nan": bool(np.isnan(result).any()), "matches": bool(np.allclose(result, reference(x, widths, seed), rtol=1e-4, atol=1e-4))}

    kernel = portkern.load(path).kernel("mlp")
    print(json.dumps(outcome(kernel, 1)), flush=True)
    now = int(sys.stdin.readline())
    try:
        report = outcome(kernel, 1)
    except portkern.PortkernError as exc:
        report = {"raised": type(exc).__name__, "message": str(exc)}
        if now:
            report["loaded_again"] = outcome(portkern.load(path).kernel("mlp"), now)
    print(json.dumps(report), flush=True)
    """
)


def build(where: Path, widths: tuple[int, ...], seed: int) -> tuple[Path, Path]:
    """The bundle of the MLP with these weights, and its manifest."""
    where.mkdir(parents=True, exist_ok=True)
    write_mlp(where / "m.onnx", widths, BATCH, seed)
    return one_kernel_bundle(where, "m.onnx", "mlp", bundle="mlp"), where / "mlp.yaml"


@pytest.fixture(scope="module", params=list(SIZES))
def bundles(request, tmp_path_factory):
    """(how the file is held, widths, {seed: (bundle, manifest)}) for seeds 1 and 7."""
    where = tmp_path_factory.mktemp(request.param)
    widths = SIZES[request.param]
    built = {seed: build(where / str(seed), widths, seed) for seed in (1, 7)}
    size = built[1][0].stat().st_size
    assert (size <= READ_LIMIT) == (request.param == "read") and size == built[7][0].stat().st_size
    return request.param, widths, built


def rebuild(live: Path, built) -> int:
    """`portkern build` of the seed-7 model over the live path (it writes by rename)."""
    from portkern.portable.builder import build_file

    inode = live.stat().st_ino
    build_file(built[7][1], live)
    assert live.stat().st_ino != inode  # a new file, renamed over the old one
    return 7


def renamed(live: Path, built) -> int:
    part = live.with_name(".mlp.pkb.part")
    shutil.copyfile(built[7][0], part)
    os.replace(part, live)
    return 7


def rewritten(live: Path, built) -> int:
    shutil.copyfile(built[7][0], live)  # `cp new.pkb live.pkb`: written into the same file
    return 7


def truncated(live: Path, built) -> int:
    os.truncate(live, live.stat().st_size // 2)  # inside the parameter section
    return 0


def expected(held: str, change) -> str:
    """How a child holding the bundle sees the change: "same" (the loaded bundle's results), or
    "refused" (BundleChangedError, then a fresh load gives the new bundle's results)."""
    return "refused" if held == "mapped" and change in (rewritten, truncated) else "same"


@pytest.mark.parametrize("change", [rebuild, renamed, rewritten, truncated], ids=lambda f: f.__name__)
def test_a_bundle_changed_under_a_process_gives_its_results_or_a_typed_error(tmp_path, bundles, change):
    held, widths, built = bundles
    live = tmp_path / "mlp.pkb"
    shutil.copyfile(built[1][0], live)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(live), ",".join(map(str, widths))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(child.stdout.readline() or "null")
        assert first == {"nan": False, "matches": True}, child.communicate(timeout=60)[1]
        now = change(live, built)
        out, err = child.communicate(f"{now}\n", timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, f"the child ended with {child.returncode} (a negative status is a signal): {err}"
    second = json.loads(out.strip().splitlines()[-1])
    if expected(held, change) == "same":
        assert second == {"nan": False, "matches": True}
    else:
        assert second["raised"] == "BundleChangedError", second
        assert "changed in place" in second["message"] and "renaming a new file over it" in second["message"]
        assert second.get("loaded_again", {"nan": False, "matches": True}) == {"nan": False, "matches": True}


def test_a_file_replaced_between_load_and_first_use_is_the_file_loaded(tmp_path, bundles, store):
    """The file is opened at `load`: a bundle renamed over the path before a kernel is made does
    not change what the loaded bundle reads; one written into it is refused (mapped) or was read."""
    held, widths, built = bundles
    x = np.random.default_rng(3).standard_normal((BATCH, widths[0]), dtype=np.float32)
    live = tmp_path / "mlp.pkb"
    shutil.copyfile(built[1][0], live)
    loaded = portkern.load(live, store=store)
    renamed(live, built)
    np.testing.assert_allclose(loaded.kernel("mlp")(x), reference(x, widths, 1), rtol=RTOL, atol=ATOL)

    shutil.copyfile(built[1][0], live)
    loaded = portkern.load(live, store=store)
    rewritten(live, built)
    with pytest.raises(BundleChangedError, match="another bundle than the one loaded"):
        loaded.kernel("mlp")
