"""A real `redis-server` on a free loopback port, for the remote-cache tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

APT_HINT = "install Debian's redis-server (./dev.sh setup does)"


def missing() -> str:
    """Why no Redis server can be started here ("" when one can)."""
    if shutil.which("redis-server") is None:
        return f"needs redis-server ({APT_HINT})"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "needs the 'redis' package (pip install 'portkern[fleet]')"
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server process; `url` reaches it, `stop()` kills it."""

    def __init__(self, where: Path, *options: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(where), *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.client().ping()

    def client(self, attempts: int = 200):
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        for _ in range(attempts):
            try:
                client.ping()
                return client
            except redis.ConnectionError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}") from None
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
