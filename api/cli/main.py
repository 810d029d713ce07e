"""`portkern`: the command-line entry point."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from portkern import __version__
from portkern.cli.common import emit, fail, quiet_broken_pipe
from portkern.errors import PortkernError, UsageError

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
    )
    root.add_argument("--version", action="version", version=f"portkern {__version__}")
    sub = root.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return root


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"portkern: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser().parse_args(argv)
    except UsageError as exc:
        return fail(exc, "--json" in argv)
    warnings.showwarning = _show_warning
    try:
        status = emit(args.handler(args), getattr(args, "json", False))
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        return quiet_broken_pipe()
    except PortkernError as exc:
        return fail(exc, getattr(args, "json", False))
    except KeyboardInterrupt:
        print("portkern: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
