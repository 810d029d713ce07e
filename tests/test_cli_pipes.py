"""Every command whose stdout reader goes away early ends quietly with exit status 141."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest

from portkern.cache.config import CacheConfig
from portkern.cache.store import Entry, Store
from portkern.cli.common import BROKEN_PIPE_STATUS
from portkern.cli.main import main

#: The smallest pipe Linux makes (one page): a command writing more than this plus the line read
#: cannot finish before the reader closes.
PIPE_BYTES = 4096


def many_devices(root, count: int = 300) -> None:
    """A cache at `root` holding one entry on each of `count` devices (a long `cache stats` table)."""
    store = Store(CacheConfig(root / "v1", 1 << 30, False))
    for i in range(count):
        key = f"{i:064x}"
        store.put(key, i.to_bytes(8, "little") * 8, Entry(
            key=key, kernel="k", bundle="b", bundle_digest="", device={"kind": "cpu", "arch": f"x{i}"},
            device_label=f"cpu:x{i}", config="default", format="vmfb", size=0, sha256="", compiler="c"))


def into_closing_reader(argv: list[str], env: dict, lines: int) -> tuple[int, bytes, str]:
    """Run `portkern argv` into a one-page pipe whose reader takes `lines` lines and closes:
    the exit status, the bytes read, and stderr."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    assert fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ) == PIPE_BYTES
    if lines == 0:
        os.close(read_end)
    with subprocess.Popen(["nice", "-n", "10", sys.executable, "-m", "portkern", *argv], stdout=write_end,
                          stderr=subprocess.PIPE, env=env) as process:
        os.close(write_end)
        taken = b""
        if lines:
            while taken.count(b"\n") < lines:
                byte = os.read(read_end, 1)
                assert byte, f"portkern {' '.join(argv)} ended after {taken!r}"
                taken += byte
            os.close(read_end)
        stderr = process.stderr.read().decode()
        return process.wait(timeout=300), taken, stderr


@pytest.mark.skipif(not hasattr(fcntl, "F_SETPIPE_SZ"), reason="sizing a pipe needs Linux")
@pytest.mark.parametrize("argv, lines", [
    (["inspect", "{bundle}"], 1),
    (["cache", "stats"], 1),
    (["devices", "--json"], 0),  # shorter than any pipe: its reader is gone before it writes
])
def test_a_closed_pipe_exits_141_without_a_traceback(argv, lines, examples_bundle, tmp_path, capsys, monkeypatch):
    argv = [a.format(bundle=examples_bundle) for a in argv]
    many_devices(tmp_path)
    monkeypatch.setenv("PORTKERN_CACHE_DIR", str(tmp_path))
    status, taken, stderr = into_closing_reader(argv, dict(os.environ), lines)
    assert (status, stderr) == (BROKEN_PIPE_STATUS, "")
    if lines:
        assert main(argv) == 0
        full = capsys.readouterr().out.encode()
        assert full.startswith(taken) and len(full) > len(taken) + PIPE_BYTES  # more than the pipe held
