"""The names of what a cache directory holds: its database, SQLite's files beside it, databases
moved aside, build locks, prepared bundles and portkern's copies of loaded ones."""

from __future__ import annotations

#: The database (entries, records, the index).
DATABASE = "cache.db"
#: Files SQLite keeps beside the database.
DATABASE_FILES = (DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm")
#: Databases that could not be opened are renamed to `cache.db.damaged-<time>-<pid>`.
DAMAGED = f"{DATABASE}.damaged-"
#: Build and tuning locks (`<name>.lock`).
LOCKS = "locks"
#: Bundles `portkern.onnx.prepare` built, kept for the same model (`<digest>.pkb`): not the database's.
BUNDLES = "bundles"
#: portkern's copies of large loaded bundles, mapped by processes (`<digest>.pkb`, `portkern.jit.parameters`).
PARAMETERS = "parameters"
