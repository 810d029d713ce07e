"""README's own-kernel example runs as written, so the README cannot drift from the code.

Blocks preceded by `<!-- readme-test: write NAME -->` are saved as NAME in a fresh
directory; blocks preceded by `<!-- readme-test: run -->` then run there in order (`sh`
blocks with bash, `python` blocks with the virtualenv's Python), with the virtualenv on
PATH as `. .venv/bin/activate` puts it, and a private cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKED_BLOCK = re.compile(r"<!-- readme-test: (write (?P<name>[\w.-]+)|run) -->\n```(?P<lang>\w+)\n(?P<body>.*?)\n```\n", re.S)


def marked_blocks() -> list[tuple[str | None, str, str]]:
    """(file name or None for a block to run, language, text) of every marked README block."""
    text = (ROOT / "README.md").read_text()
    return [(m["name"], m["lang"], m["body"] + "\n") for m in MARKED_BLOCK.finditer(text)]


def test_readme_marks_the_kernel_the_manifest_and_the_commands():
    blocks = marked_blocks()
    written = {name for name, _, _ in blocks if name}
    assert {"scaled_matmul.mlir", "manifest.yaml"} <= written
    assert [lang for name, lang, _ in blocks if name is None] == ["sh", "python"]


def activated_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = sys.prefix
    env["PORTKERN_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def test_readme_own_kernel_example_runs_as_written(tmp_path):
    env = activated_env(tmp_path)
    work = tmp_path / "kernel"
    work.mkdir()
    for name, lang, body in marked_blocks():
        if name:
            (work / name).write_text(body)
            continue
        command = ["bash", "-euo", "pipefail", "-c", body] if lang == "sh" else [sys.executable, "-c", body]
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"README {lang} block failed:\n{body}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert (work / "mine.pkb").is_file() and (work / "out.npz").is_file()


def test_dev_sh_passes_portkern_commands_through_from_any_directory(tmp_path):
    if not (Path(sys.prefix) / ".portkern-installed").is_file():
        pytest.skip("the running virtualenv was not set up by dev.sh")
    env = activated_env(tmp_path)
    env["PORTKERN_VENV"] = sys.prefix
    (tmp_path / "m.yaml").write_text("bundle: b\nkernels:\n  - name: k\n    sourse: k.mlir\n")
    done = subprocess.run([str(ROOT / "dev.sh"), "portkern", "build", "m.yaml", "-o", "b.pkb"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    # The relative path was read from the caller's directory: the error is about its content.
    assert done.returncode == 1
    assert "m.yaml:3: kernels[0]: unknown key 'sourse' (did you mean 'source'?)" in done.stderr
