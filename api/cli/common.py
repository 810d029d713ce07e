"""What every `portkern` command shares: reports, JSON output, formatting, the store."""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from portkern.base.errors import PortkernError, UsageError, brief, printable
from portkern.base.records import record

#: Version of the `--json` output of `build`, `check`, `finalize`, `run` and `tune` (its `json_format` field);
#: raised when a field changes meaning or goes away.
JSON_FORMAT = 1

#: Exit status of a command whose output pipe closed early (as for a process ended by SIGPIPE).
BROKEN_PIPE_STATUS = 141

if TYPE_CHECKING:
    from rich.console import Console

#: A command's result: plain data for `--json`, and how to show it to a person.
Render = Callable[["Console"], None]  # rich's Console, imported lazily


@record
class Report:
    data: Any
    render: Render | None = None
    #: Process exit status (0 unless the command found something wrong).
    status: int = 0


#: Width of output that is not a terminal (a pipe, a file, a test): wide enough that no
#: table column folds and no line wraps inside a figure.
UNWRAPPED_WIDTH = 1000


def console(stderr: bool = False):
    """A rich console; when not writing to a terminal, one that never wraps or folds. A closed
    output pipe raises BrokenPipeError (which `main` turns into exit status 141) instead of
    rich's own exit with status 1."""
    from rich.console import Console

    class PipedConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "output pipe closed")

    out = PipedConsole(stderr=stderr, highlight=False)
    if not out.is_terminal:
        out = PipedConsole(stderr=stderr, highlight=False, width=UNWRAPPED_WIDTH, soft_wrap=True)
    return out


def emit(report: Report, as_json: bool) -> int:
    if as_json:
        json.dump(report.data, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    elif report.render is not None:
        report.render(console())
    return report.status


def shown(value: object) -> str:
    """Text from a file (a bundle, a cache entry) for rich output: `printable`, with rich markup escaped."""
    from rich.markup import escape

    return escape(printable(value))


def table(title: str | None, columns: list[str], rows: list[list[Any]]):
    """A rich table; every title and cell is `shown` (nothing in them is markup)."""
    from rich.table import Table

    title = shown(title) if title else None
    t = Table(title=title, title_justify="left", header_style="bold", min_width=len(title) if title else None)
    for name in columns:
        t.add_column(name, overflow="fold")
    for row in rows:
        t.add_row(*("" if v is None else shown(v) for v in row))
    return t




def human_age(timestamp: float, now: float | None = None) -> str:
    seconds = max(0.0, (now or time.time()) - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def device_filter(spec: str | None, store=None) -> str | None:
    """What `--device` selects cache entries by: a fingerprint digest prefix (8+ hex digits)
    or a device label the store holds, as given; else the label of the device `spec` names,
    in any spelling `finalize --target` accepts ("gfx942", "amdgpu:gfx942", "cpu",
    "cpu:znver4", ...); DeviceError for others. An OpenCL device resolves only on its own
    machine, so an `opencl:` label is taken as written."""
    from portkern.base.errors import DeviceError
    from portkern.cache.store import Filter
    from portkern.jit import devices

    if spec is None or re.fullmatch(r"[0-9a-f]{8,64}", spec) or (store is not None and store.count(Filter(device=spec))):
        return spec
    try:
        return devices.resolve(spec, store).label
    except DeviceError:
        kind, arch = devices.parse(spec)
        if kind == "opencl" and arch and not arch.isdigit():
            return spec
        raise


def add_sign(parser: argparse.ArgumentParser, what: str) -> None:
    """`--sign [KEY]`: sign the written file (see `portkern.base.signing.key_to_sign_with`)."""
    parser.add_argument(
        "--sign",
        nargs="?",
        const="",
        metavar="KEY",
        help=f"sign {what} (writes FILE.sig, OpenSSF Model Signing format) with this private key; "
        "without KEY, and by default when it is set, with $PORTKERN_SIGNING_KEY",
    )


def add_cache_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", metavar="DIR", help="cache directory (default: $PORTKERN_CACHE_DIR or the user cache dir)")


def store_from(args: argparse.Namespace):
    """The cache store the command should use (`--cache-dir` over the environment)."""
    from portkern.cache.config import from_env
    from portkern.cache.remote import from_env as remote_from_env
    from portkern.cache.store import Store

    return Store(from_env(getattr(args, "cache_dir", None)), remote_from_env())


def fail(exc: PortkernError, as_json: bool) -> int:
    """Report an error: JSON on stdout under `--json`, one line on stderr; the exit status."""
    message = brief(exc, None, sep=" ", limit=None)
    if as_json:
        print(json.dumps({"error": type(exc).__name__, "message": message}))
    print(f"portkern: error: {printable(message)}", file=sys.stderr)
    return 2 if isinstance(exc, UsageError) else 1


def quiet_broken_pipe() -> int:
    """End quietly after the reader of stdout went away (`portkern cache ls | head`): point stdout
    at /dev/null so the interpreter's final flush cannot fail; the exit status."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return BROKEN_PIPE_STATUS
