"""Which compiler produced a portable stage, and whether the installed one can read it."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path
from typing import Any

from portkern.base.errors import IncompatibleProducerError, printable
from portkern.base.records import from_plain, frozen_record, to_plain


@frozen_record
class Producer:
    """The compiler that wrote a stage and the MLIR bytecode version it used."""

    compiler: str
    version: str
    revision: str = ""
    #: MLIR bytecode version; None for producers of other formats (e.g. SPIR-V).
    bytecode_version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Producer":
        return from_plain(cls, data)


@frozen_record
class Installed:
    """An installed IREE package's version and source revision."""

    version: str
    revision: str

    @property
    def release(self) -> tuple[int, int]:
        return release_of(self.version)


def _read_version_file(path: Path) -> Installed:
    """VERSION and REVISIONS from an IREE `version.py`, read without running it."""
    values: dict[str, Any] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("VERSION", "REVISIONS"):
                values[target.id] = ast.literal_eval(node.value)
    revisions = values.get("REVISIONS") or {}
    return Installed(str(values.get("VERSION", "unknown")), str(dict(revisions).get("IREE", "")))


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise IncompatibleProducerError(f"{name} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


@functools.lru_cache(maxsize=None)
def installed_compiler() -> Installed:
    """The installed iree-base-compiler (without importing it)."""
    return _read_version_file(_package_dir("iree.compiler") / "version.py")


@functools.lru_cache(maxsize=None)
def installed_runtime() -> Installed:
    """The installed iree-base-runtime (without importing it)."""
    return _read_version_file(_package_dir("iree._runtime_libs") / "version.py")


@functools.lru_cache(maxsize=None)
def max_bytecode_version() -> int:
    """The newest MLIR bytecode version the installed compiler reads (the one it writes)."""
    from portkern.portable.compiler import Compiler, bytecode, bytecode_version

    return bytecode_version(bytecode(Compiler().parse("module {}")))


def current_producer(bytecode_version: int) -> Producer:
    """The producer record for a stage written now with the installed compiler."""
    installed = installed_compiler()
    return Producer("iree", installed.version, installed.revision, bytecode_version)


@functools.lru_cache(maxsize=64)
def release_of(version: str) -> tuple[int, int]:
    """`(major, minor)` of an IREE version such as `3.13.0rc20261016`."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise IncompatibleProducerError(f"cannot read IREE version {version!r}")
    return int(match.group(1)), int(match.group(2))


def same_release(producer: Producer) -> bool:
    """Whether the installed IREE is of the release that produced a stage."""
    try:
        return producer.compiler == "iree" and release_of(producer.version) == installed_compiler().release
    except IncompatibleProducerError:
        return False


def check_release(producer: Producer, kernel: str = "") -> None:
    """Refuse a stage from another IREE release: IREE's dialects are not versioned,
    so only the producing release is known to read them back."""
    where = f"kernel {kernel!r}: " if kernel else ""
    if producer.compiler != "iree":
        raise IncompatibleProducerError(f"{where}unknown producer compiler {producer.compiler!r}")
    installed = installed_compiler()
    if release_of(producer.version) != installed.release:
        raise IncompatibleProducerError(
            f"{where}built with IREE {printable(producer.version)}, but IREE {installed.version} is installed; "
            f"IREE's dialects are not versioned, so rebuild the bundle with IREE "
            f"{'.'.join(map(str, installed.release))}.x or install iree-base-compiler=="
            f"{'.'.join(map(str, release_of(producer.version)))}.*"
        )


def check_bytecode(producer: Producer, kernel: str = "") -> None:
    """Refuse MLIR bytecode newer than the installed compiler reads."""
    newest = max_bytecode_version()
    if producer.bytecode_version is not None and producer.bytecode_version > newest:
        where = f"kernel {kernel!r}: " if kernel else ""
        raise IncompatibleProducerError(
            f"{where}MLIR bytecode version {producer.bytecode_version} is newer than the "
            f"installed compiler reads (up to {newest})"
        )
