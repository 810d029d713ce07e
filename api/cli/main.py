"""`portkern`: the command-line entry point."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings

from portkern import __version__
from portkern.base.errors import PortkernError, UsageError
from portkern.cli.common import emit, fail, quiet_broken_pipe

#: Modules that each add one or more subcommands with `register(subparsers)`.
COMMANDS = (
    "portkern.cli.build",
    "portkern.cli.run",
    "portkern.cli.devices",
    "portkern.cli.cache",
    "portkern.cli.demo",
    "portkern.cli.finalize",
    "portkern.cli.check",
    "portkern.cli.tune",
    "portkern.cli.profile",
    "portkern.cli.keys",
)


class Parser(argparse.ArgumentParser):
    """argparse, with a bad command line raised as UsageError (so `--json` can report it)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def parser() -> argparse.ArgumentParser:
    root = Parser(
        prog="portkern",
        description="Build portable kernel bundles; finalise, tune, cache and run them on this machine.",
        epilog="Exit status: 0 done; 1 failed or found something wrong; 2 bad command line; 130 interrupted; "
        "141 stdout closed early (`portkern ... | head`), as for a process ended by SIGPIPE.",
    )
    root.add_argument("--version", action="version", version=f"portkern {__version__}")
    sub = root.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return root


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"portkern: warning: {message}", file=sys.stderr)


class _LogToStderr(logging.Handler):
    """portkern's logged warnings (operational events: a fallback taken, an entry dropped), shown
    as its warnings are, on the stderr of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"portkern: {record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status: 0, 1 when the command failed or found something wrong,
    2 for a bad command line, 130 when interrupted, and 141 (the shell's status for a process
    ended by SIGPIPE) for every command whose stdout closed before it finished writing
    (`portkern inspect B | head -1`), with nothing on stderr."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            status = _run(argv)
        finally:  # `--help` and `--version` end in SystemExit with their text still buffered
            sys.stdout.flush()
        return status
    except BrokenPipeError:
        return quiet_broken_pipe()


def _run(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
    except UsageError as exc:
        return fail(exc, "--json" in argv)
    warnings.showwarning = _show_warning
    shown = _LogToStderr(logging.WARNING)
    logging.getLogger("portkern").addHandler(shown)
    try:
        return emit(args.handler(args), getattr(args, "json", False))
    except PortkernError as exc:
        return fail(exc, getattr(args, "json", False))
    except KeyboardInterrupt:
        print("portkern: interrupted", file=sys.stderr)
        return 130
    finally:
        logging.getLogger("portkern").removeHandler(shown)


if __name__ == "__main__":
    sys.exit(main())
