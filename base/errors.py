"""Every error portkern raises on purpose. All derive from `PortkernError`.

The CLI prints `str(error)` as a one-line message and exits non-zero; anything
that is not a `PortkernError` is a bug.
"""

from __future__ import annotations

import functools
import re
from typing import Iterable


class PortkernError(Exception):
    """Base class of all portkern errors."""


def message_lines(text: object) -> list[str]:
    """The non-empty lines of a message (a tool's output, an exception), stripped."""
    return [line.strip() for line in str(text).splitlines() if line.strip()]


def brief(text: object, lines: int | None = 1, *, last: bool = False, limit: int | None = 500, sep: str = " | ") -> str:
    """The first `lines` (with `last`: the final ones; None: all) distinct non-empty lines of
    a message (a tool's output, an exception), joined by `sep`, cut at `limit` characters;
    "" when it has none."""
    found = list(dict.fromkeys(message_lines(text)))
    if lines is not None:
        found = found[-lines:] if last else found[:lines]
    return sep.join(found)[:limit]


def printable(value: object) -> str:
    """`value` as text that cannot steer a terminal: control and format characters (a
    right-to-left override, a zero-width joiner, an escape, a newline) and line or paragraph
    separators are written as `\\uXXXX`; a tab (indentation a message may quote) is kept."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in " \t" else f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}" for ch in text)


def one_line(text: object, limit: int | None = None) -> str:
    """Every distinct non-empty line of a message joined by spaces, cut at `limit` characters."""
    return brief(text, None, sep=" ", limit=limit)


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The patterns `gist` trims: a source location, and a compiler phase or location prefix."""
    return re.compile(r" [^\s:]*:\d+:\d+: "), re.compile(r"^.*?IREE failed between phases \S+ and \S+: |^[^\s:]*:\d+:\d+: ")


def gist(text: object, limit: int = 200) -> str:
    """The gist of a message: its first line without compiler phase and source-location prefixes."""
    line = brief(text, limit=None)
    if not line:
        return "failed without a diagnostic"
    location, noise = _patterns()
    while (trimmed := noise.sub("", line, count=1)) != line:
        line = trimmed
    return location.split(line, maxsplit=1)[0][:limit]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A hint naming the closest of `choices` to a misspelt `word` (`" (did you mean 'x'?)"`), or ""."""
    import difflib  # (only for a misspelt name: `import portkern` does not load it)

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- build host -------------------------------------------------------------


class ManifestError(PortkernError):
    """The manifest is malformed, names missing files, or repeats a kernel."""


class CompileError(PortkernError):
    """The IREE compiler (or another kernel compiler) rejected its input."""


class BuildError(CompileError):
    """A kernel source failed to compile or import on the build host."""


class LaunchSpecError(PortkernError, ValueError):
    """An OpenCL kernel's launch description (arguments, sizes, expressions) is malformed."""


# --- bundle format ----------------------------------------------------------


class BundleError(PortkernError):
    """A bundle file cannot be read or trusted."""


class BundleTruncatedError(BundleError):
    """The file ends before its header or payload does."""


class BadMagicError(BundleError):
    """The file does not start with the portkern bundle magic."""


class UnsupportedVersionError(BundleError):
    """The bundle's format version is not one this portkern reads."""


class DigestMismatchError(BundleError):
    """The content does not hash to the digest recorded for it."""


class OversizeFieldError(BundleError):
    """A field, blob or the whole file is larger than the reader allows."""


class MalformedBundleError(BundleError):
    """The payload decodes but does not match the bundle schema."""


class BundleChangedError(BundleError):
    """A loaded bundle's file was changed in place (written into or truncated) after `load`,
    before or while its parameters were read or copied: load it again (and replace live
    bundles by rename)."""


class IncompatibleProducerError(BundleError):
    """The bundle was produced by a compiler the installed one cannot read."""


# --- device side ------------------------------------------------------------


class KernelNotFoundError(PortkernError, KeyError):
    """No kernel of that name is in the bundle."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DeviceError(PortkernError):
    """The requested device is absent, unsupported or cannot run this code."""


class FinalizeError(CompileError):
    """Compiling a portable stage to native code failed on the device."""


class CompileForbiddenError(FinalizeError):
    """A kernel has no native code here and compiling is turned off (`PORTKERN_COMPILE=never`)."""


class CodeObjectError(FinalizeError):
    """Native code does not hold device code for the GPU it is meant for."""


class ArgumentTypeError(PortkernError, TypeError):
    """A kernel was called with the wrong number or dtype of arguments, or a portkern function
    with an argument of the wrong type."""


class ArgumentShapeError(PortkernError, ValueError):
    """A kernel argument has the wrong shape."""


class KernelRuntimeError(PortkernError):
    """The runtime failed while executing a kernel."""


class ForkError(DeviceError):
    """Device runtime state inherited across fork() cannot be used or rebuilt in this process."""


class ExitingError(KernelRuntimeError):
    """The process is exiting: the kernel runtime takes no more calls before it is torn down."""


# --- cache and tuning -------------------------------------------------------


class UsageError(PortkernError):
    """A command line the `portkern` command does not accept."""


class CacheError(PortkernError):
    """The cache cannot be used as asked (bad key, unreadable export file, ...)."""


class SettingError(PortkernError, ValueError):
    """A size or a duration that cannot be read (`portkern.base.settings`)."""


class PerfConfigError(PortkernError, ValueError):
    """A perf-config string or value is malformed."""


class TuningError(PortkernError):
    """Tuning could not produce any valid configuration."""


class DispatchTuningError(TuningError):
    """Tuning one dispatch of a kernel failed; says which kernel and dispatch, and why."""

    def __init__(self, kernel: str, dispatch: str, reason: str) -> None:
        super().__init__(f"{kernel}: dispatch {dispatch}: {reason}")
        self.kernel, self.dispatch, self.reason = kernel, dispatch, reason


# --- signatures -------------------------------------------------------------


class SignatureError(PortkernError):
    """A signature cannot be made or does not vouch for what it should."""


class KeyFileError(SignatureError):
    """A key or trusted-keys file is missing, unreadable or of a kind that cannot sign."""


class UnsignedError(SignatureError):
    """Something that must be signed by a trusted key carries no signature."""


class UntrustedKeyError(SignatureError):
    """A signature does not verify, or was made by a key this machine does not trust."""


#: `from portkern.base.errors import *` exports the error types only.
__all__ = [name for name, value in list(globals().items()) if isinstance(value, type) and issubclass(value, Exception)]
