"""Every `PORTKERN_*` environment setting: the one module that reads them.

| setting | meaning | default | bounds |
|---|---|---|---|
| `PORTKERN_CACHE_DIR` | cache directories, separated by `os.pathsep` | the user cache dir | |
| `PORTKERN_CACHE_DISABLE` | no cache at all | off | |
| `PORTKERN_CACHE_MAXSIZE` | size budget of the cache | `1GiB` | at most `1EiB`; below `1KiB` (one entry) nothing is kept, and it warns |
| `PORTKERN_COMPILE_TIMEOUT` | wall time of one compile job | `120s` | more than 0, at most `7d` |
| `PORTKERN_COMPILE_MEMORY` | address space of a compile worker (`0`: none) | `8GiB` | at most `1PiB` |
| `PORTKERN_COMPILE` | `auto`: compile what has no native code here; `never`: a typed error instead (`CompileForbiddenError`) | `auto` | |
| `PORTKERN_BACKGROUND` | serve baseline code while the exact code is built | on | |
| `PORTKERN_EXECUTOR_MIN_BYTES` | a CPU call whose arguments total this size or more runs on IREE's task executor (spread over the cores), a smaller one on the calling thread (docs/serving.md) | `4MiB` | `0`: every call; `inf`: none |
| `PORTKERN_REMOTE_CACHE` | `redis://` URL of the remote tier | none | |
| `PORTKERN_REMOTE_MAX_VALUE` | largest value written to or read from Redis | `64MiB` | at least 1 byte, at most `512MiB` (Redis's limit) |
| `PORTKERN_REMOTE_TIMEOUT` | seconds per Redis operation | `2s` | more than 0, at most `1h` |
| `PORTKERN_REMOTE_LOCK_S` | longest wait for another host's build lock | `30s` | at least 0, at most `1d` |
| `PORTKERN_TRUSTED_KEYS` | file of trusted public keys | none | |
| `PORTKERN_REQUIRE_SIGNATURE` | native code only when signed by a trusted key | off | an unreadable value is on |
| `PORTKERN_SIGNING_KEY` | private key that signs what this machine publishes | none | |
| `PORTKERN_ROLE` | `publisher` or `reader` (`portkern.base.signing` checks it) | by `PORTKERN_SIGNING_KEY` | |

Sizes are a number of bytes with an optional suffix, with one meaning per suffix everywhere:
decimal `K`/`KB` = 10^3, `M`/`MB` = 10^6, `G`/`GB` = 10^9, `T`/`TB` = 10^12, `P`/`PB` = 10^15, `E`/`EB` = 10^18;
binary `Ki`/`KiB` = 2^10, `Mi`/`MiB` = 2^20, `Gi`/`GiB` = 2^30, `Ti`/`TiB` = 2^40, `Pi`/`PiB` = 2^50,
`Ei`/`EiB` = 2^60 (any case). So `4G` is 4,000,000,000 bytes and `4GiB` 4,294,967,296, for every
setting. Durations are a number of seconds with an optional suffix `ms`, `s`, `m` (minutes), `h`,
`d` or `w`. `inf` is accepted and means the largest value the setting allows.

Flags take `1/true/yes/on` and `0/false/no/off` (any case).

One policy for a value that cannot be used: one `SettingWarning` per process and value, then the
default (`PORTKERN_REQUIRE_SIGNATURE` fails closed: on); a value above its bound is one
`SettingWarning` and the bound. Reading a setting never
raises. Settings are read from the environment each time they are asked for, so a change takes
effect at the next use.
"""

from __future__ import annotations

import math
import os
import re
import sys
import warnings
from types import FrameType
from typing import Callable, TypeVar

from portkern.base.errors import SettingError

CACHE_DIR = "PORTKERN_CACHE_DIR"
CACHE_DISABLE = "PORTKERN_CACHE_DISABLE"
CACHE_MAXSIZE = "PORTKERN_CACHE_MAXSIZE"
COMPILE_TIMEOUT = "PORTKERN_COMPILE_TIMEOUT"
COMPILE_MEMORY = "PORTKERN_COMPILE_MEMORY"
COMPILE = "PORTKERN_COMPILE"
BACKGROUND = "PORTKERN_BACKGROUND"
EXECUTOR_MIN_BYTES = "PORTKERN_EXECUTOR_MIN_BYTES"
REMOTE_CACHE = "PORTKERN_REMOTE_CACHE"
REMOTE_MAX_VALUE = "PORTKERN_REMOTE_MAX_VALUE"
REMOTE_TIMEOUT = "PORTKERN_REMOTE_TIMEOUT"
REMOTE_LOCK_S = "PORTKERN_REMOTE_LOCK_S"
TRUSTED_KEYS = "PORTKERN_TRUSTED_KEYS"
REQUIRE_SIGNATURE = "PORTKERN_REQUIRE_SIGNATURE"
SIGNING_KEY = "PORTKERN_SIGNING_KEY"
ROLE = "PORTKERN_ROLE"

DEFAULT_CACHE_MAXSIZE = 1 << 30
LARGEST_CACHE_MAXSIZE = 1 << 60
#: No cached entry (a native code object with its record) is smaller than this.
SMALLEST_ENTRY = 1 << 10
DEFAULT_COMPILE_TIMEOUT_S = 120.0
LARGEST_COMPILE_TIMEOUT_S = 7 * 86400.0
DEFAULT_COMPILE_MEMORY = 8 << 30
#: `PORTKERN_COMPILE` values: compile what has no native code here (the default), or never compile.
COMPILE_AUTO, COMPILE_NEVER = "auto", "never"
#: Larger than any address space a 64-bit kernel gives a process today.
LARGEST_COMPILE_MEMORY = 1 << 50
#: CPU calls whose arguments total this many bytes or more run on IREE's task executor.
DEFAULT_EXECUTOR_MIN_BYTES = 4 << 20
DEFAULT_REMOTE_MAX_VALUE = 64 << 20
#: Redis refuses string values above 512 MiB.
LARGEST_REMOTE_MAX_VALUE = 512 << 20
DEFAULT_REMOTE_TIMEOUT_S = 2.0
LARGEST_REMOTE_TIMEOUT_S = 3600.0
DEFAULT_REMOTE_LOCK_S = 30.0
LARGEST_REMOTE_LOCK_S = 86400.0
#: What `parse_size` and `parse_duration` give for `inf` and never exceed.
LARGEST_SIZE = 1 << 62
LARGEST_DURATION_S = 100 * 365 * 86400.0

_SIZE_UNITS = {"": 1, "b": 1}
for _power, _letter in enumerate("kmgtpe", start=1):
    _SIZE_UNITS[_letter] = _SIZE_UNITS[_letter + "b"] = 10 ** (3 * _power)
    _SIZE_UNITS[_letter + "i"] = _SIZE_UNITS[_letter + "ib"] = 1 << (10 * _power)
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_NUMBER = r"\s*(\d+(?:\.\d*)?|\.\d+|infinity|inf)\s*([a-z]*)\s*"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SettingWarning(UserWarning):
    """A `PORTKERN_*` setting could not be used as given; its default (or its bound) is used."""


def _size(text: str) -> int | float:
    """Exact bytes (integer arithmetic; `math.inf` for `inf`)."""
    match = re.fullmatch(_NUMBER, str(text), re.IGNORECASE)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise SettingError(f"cannot read size {text!r} (examples: 2GB, 512MiB, 1000000)")
    number, scale = match.group(1), _SIZE_UNITS[match.group(2).lower()]
    if number.lower().startswith("inf"):
        return math.inf
    whole, _, fraction = number.partition(".")
    size: int = int(whole or "0") * scale + int(fraction or "0") * scale // 10 ** len(fraction)
    return size


def _duration(text: str) -> float:
    match = re.fullmatch(_NUMBER, str(text), re.IGNORECASE)
    if not match or match.group(2).lower() not in _DURATION_UNITS:
        raise SettingError(f"cannot read duration {text!r} (examples: 30d, 12h, 90m, 45s, 1.5)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]


def parse_size(text: str) -> int:
    """Bytes in a size such as `2GB` (2*10^9), `512MiB` (512*2^20), `1.5G` or `1000`; `inf` is `LARGEST_SIZE`.
    A `SettingError` when it is not a size."""
    return int(min(_size(text), LARGEST_SIZE))


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `30d`, `12h`, `90m`, `45s`, `250ms` or `1.5`; `inf` is
    `LARGEST_DURATION_S`. A `SettingError` when it is not a duration."""
    return min(_duration(text), LARGEST_DURATION_S)


_warned: set[tuple[str, str]] = set()


def warn(name: str, value: str, consequence: str) -> None:
    """One `SettingWarning` per process for setting `name` given as `value`."""
    if (name, value) not in _warned:
        _warned.add((name, value))
        warnings.warn(f"{name}={value!r} {consequence}", SettingWarning, stacklevel=_outside())


def _outside() -> int:
    """The `stacklevel` of the first caller outside this module, seen from `warn`."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


def _raw(name: str) -> str:
    return os.environ.get(name, "")


def text(name: str) -> str:
    """The setting `name` as given, stripped ("" when unset)."""
    return _raw(name).strip()


def flag(name: str, default: bool = False, unreadable: bool | None = None) -> bool:
    """A boolean setting: 1/0, true/false, yes/no, on/off (any case); unset or empty is
    `default`, anything else is one warning and `default` (`unreadable` instead where given:
    a security setting fails closed)."""
    raw = _raw(name)
    value = raw.strip().lower()
    if not value:
        return default
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    used = default if unreadable is None else unreadable
    what = f"using the default ({'on' if used else 'off'})" if used == default else f"treated as {'on' if used else 'off'}"
    warn(name, raw, f"is not one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}; {what}")
    return used


_Number = TypeVar("_Number", int, float)


def _bounded(
    name: str, read: Callable[[str], float], default: _Number, low: float, high: _Number, show: Callable[[float], str], what: str, *, above: bool = False
) -> _Number:
    """Setting `name` read by `read`; `default` when unset or unusable (one warning), `high`
    when larger (one warning). `low` is the smallest allowed value (excluded when `above`)."""
    raw = _raw(name)
    if not raw.strip():
        return default
    try:
        value = read(raw)
    except SettingError:
        warn(name, raw, f"is not {what}; using the default {show(default)}")
        return default
    if value < low or (above and value == low):
        warn(name, raw, f"must be {'more than' if above else 'at least'} {show(low)}; using the default {show(default)}")
        return default
    if value > high:
        warn(name, raw, f"is more than the largest allowed, {show(high)}; using {show(high)}")
        return high
    return type(default)(value)


def _bytes(value: float) -> str:
    return f"{int(value)} bytes"


def _seconds(value: float) -> str:
    return f"{float(value):g} s"


def _size_setting(name: str, default: int, high: int, low: int = 0) -> int:
    return _bounded(name, _size, default, low, high, _bytes, "a size (examples: 2GB, 512MiB, 1000000)")


def _duration_setting(name: str, default: float, high: float, *, zero: bool = False) -> float:
    return _bounded(name, _duration, default, 0.0, high, _seconds, "a duration (examples: 90s, 2m, 1.5)", above=not zero)


def cache_dirs() -> tuple[str, ...]:
    """The directories `PORTKERN_CACHE_DIR` lists, in order (empty: use the default one)."""
    raw = _raw(CACHE_DIR)
    if CACHE_DIR in os.environ and not raw.strip():
        warn(CACHE_DIR, raw, "is empty; using the default cache directory")
    return tuple(part for part in raw.split(os.pathsep) if part.strip())


def cache_disabled() -> bool:
    """`PORTKERN_CACHE_DISABLE`: no cache at all."""
    return flag(CACHE_DISABLE)


def cache_max_size() -> int:
    """`PORTKERN_CACHE_MAXSIZE` in bytes; below one entry it warns that nothing will be kept."""
    value = _size_setting(CACHE_MAXSIZE, DEFAULT_CACHE_MAXSIZE, LARGEST_CACHE_MAXSIZE)
    if value < SMALLEST_ENTRY:
        warn(CACHE_MAXSIZE, _raw(CACHE_MAXSIZE), f"is smaller than any cache entry (none is below {SMALLEST_ENTRY} bytes): nothing will be kept in the cache")
    return value


def compile_timeout_s() -> float:
    """`PORTKERN_COMPILE_TIMEOUT`: the wall-time bound of one compile job, in seconds."""
    return _duration_setting(COMPILE_TIMEOUT, DEFAULT_COMPILE_TIMEOUT_S, LARGEST_COMPILE_TIMEOUT_S)


def compile_memory() -> int:
    """`PORTKERN_COMPILE_MEMORY`: the address-space bound of a compile worker in bytes (0: none)."""
    return _size_setting(COMPILE_MEMORY, DEFAULT_COMPILE_MEMORY, LARGEST_COMPILE_MEMORY)


def compile_mode() -> str:
    """`PORTKERN_COMPILE`: `auto` (compile a kernel that has no native code here) or `never`
    (refuse instead); any case. Another value is one warning and `auto`."""
    raw = _raw(COMPILE)
    value = raw.strip().lower()
    if not value:
        return COMPILE_AUTO
    if value in (COMPILE_AUTO, COMPILE_NEVER):
        return value
    warn(COMPILE, raw, f"is not {COMPILE_AUTO!r} or {COMPILE_NEVER!r}; using the default ({COMPILE_AUTO})")
    return COMPILE_AUTO


def background() -> bool:
    """`PORTKERN_BACKGROUND`: serve baseline code while the exact code is built (default on)."""
    return flag(BACKGROUND, True)


def executor_min_bytes() -> int:
    """`PORTKERN_EXECUTOR_MIN_BYTES`: a CPU call whose arguments total this many bytes or more
    runs on IREE's task executor, a smaller one on the calling thread (`0`: every call on the
    executor; `inf`: none, without a warning)."""
    return _bounded(EXECUTOR_MIN_BYTES, parse_size, DEFAULT_EXECUTOR_MIN_BYTES, 0, LARGEST_SIZE, _bytes, "a size (examples: 2GB, 512MiB, 1000000)")


def remote_url() -> str:
    """`PORTKERN_REMOTE_CACHE` ("" when there is no remote tier)."""
    return text(REMOTE_CACHE)


def remote_max_value() -> int:
    """`PORTKERN_REMOTE_MAX_VALUE`: the largest value written to or read from the remote tier."""
    return _size_setting(REMOTE_MAX_VALUE, DEFAULT_REMOTE_MAX_VALUE, LARGEST_REMOTE_MAX_VALUE, low=1)


def remote_timeout_s() -> float:
    """`PORTKERN_REMOTE_TIMEOUT`: seconds per remote operation."""
    return _duration_setting(REMOTE_TIMEOUT, DEFAULT_REMOTE_TIMEOUT_S, LARGEST_REMOTE_TIMEOUT_S)


def remote_lock_s() -> float:
    """`PORTKERN_REMOTE_LOCK_S`: the longest a host waits for another host's build lock, in seconds."""
    return _duration_setting(REMOTE_LOCK_S, DEFAULT_REMOTE_LOCK_S, LARGEST_REMOTE_LOCK_S, zero=True)


def trusted_keys_file() -> str:
    """`PORTKERN_TRUSTED_KEYS` ("" when unset)."""
    return text(TRUSTED_KEYS)


def signing_key_file() -> str:
    """`PORTKERN_SIGNING_KEY` ("" when unset)."""
    return text(SIGNING_KEY)


def role() -> str:
    """`PORTKERN_ROLE`, lower case ("" when unset)."""
    return text(ROLE).lower()


def require_signature() -> bool:
    """`PORTKERN_REQUIRE_SIGNATURE`: native code only from values a trusted key signed. An
    unreadable value is one warning and on (it fails closed, as it did before this module)."""
    return flag(REQUIRE_SIGNATURE, False, unreadable=True)

