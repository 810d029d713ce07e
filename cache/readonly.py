"""diskcache over a cache directory this process cannot write (a read-only mount, an image layer).

`diskcache.Cache()` writes its settings when it opens a directory, so it cannot open such a one.
`ReadOnlyCache` opens the database with SQLite's `mode=ro`; where SQLite cannot share the
database that way (a WAL database whose `-shm` file is absent and cannot be created, which is
how a cleanly closed cache looks on a read-only mount) it opens it `immutable`: the file as last
checkpointed, without locks. Reads work as in diskcache; every write raises
`sqlite3.OperationalError`.

Measured with SQLite 3.40 on a read-only bind mount (as root): `mode=ro` fails with "unable to
open database file" for a cleanly closed cache; `mode=ro&immutable=1` reads it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import diskcache
from diskcache.core import DBNAME

#: Tried in order.
_MODES = ("mode=ro", "mode=ro&immutable=1")


def writable(directory: Path) -> bool:
    """Whether this process may create files in `directory` (false on a read-only mount, even for root).
    A directory that does not exist yet counts as writable: creating it is how a cache starts."""
    while not directory.exists() and directory.parent != directory:
        directory = directory.parent
    return os.access(directory, os.W_OK)


class ReadOnlyCache(diskcache.Cache):
    """A `diskcache.Cache` that only reads an existing cache directory."""

    read_only = True

    def __init__(self, directory: Path, timeout: float = 60.0) -> None:  # noqa: super().__init__ writes
        database = Path(directory, DBNAME)
        if not database.is_file():
            raise FileNotFoundError(f"{database} does not exist")
        self._directory = str(directory)
        self._timeout = timeout
        self._local = threading.local()
        self._txn_id = None
        for mode in _MODES:
            self._uri = f"{database.resolve().as_uri()}?{mode}"
            self.close()
            try:
                settings = dict(self._con.execute("SELECT key, value FROM Settings").fetchall())
                break
            except sqlite3.OperationalError:
                if mode == _MODES[-1]:
                    raise
        self._disk = diskcache.Disk(self._directory, **{k[5:]: v for k, v in settings.items() if k.startswith("disk_")})
        for key, value in settings.items():
            setattr(self, key, value)
        ((self._page_size,),) = self._con.execute("PRAGMA page_size").fetchall()

    @property
    def _con(self) -> sqlite3.Connection:
        if getattr(self._local, "pid", None) != os.getpid():
            self.close()
            self._local.pid = os.getpid()
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = sqlite3.connect(self._uri, uri=True, timeout=self._timeout, isolation_level=None)
        return con
