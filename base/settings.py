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
| `PORTKERN_CONFIG` | the config file (below); set and empty: none | `portkern.toml` in the user config dir, if there | |

A config file may hold any setting above but `PORTKERN_CONFIG`, named without the prefix
in lower case (`cache_maxsize = "2GB"`, `require_signature = true`, `remote_timeout = 5`):
`portkern.toml` (the `platformdirs` user config dir, e.g. `~/.config/portkern/portkern.toml`),
or the file `PORTKERN_CONFIG` names; a file called `pyproject.toml` gives its `[tool.portkern]`
table, any other its top level. Values are TOML strings (as the environment spells them),
numbers (bytes, seconds) or booleans (flags); `cache_dir` may be a list of directories;
relative paths (`cache_dir`, `trusted_keys`, `signing_key`) are relative to the file's
directory. The environment wins: a setting set in the environment (even empty) is not read
from the file. A key that is no setting, a value of another type, or a file that cannot be
read or parsed is one `SettingWarning` (its settings, or that one, are not used); a bad value
warns like a bad environment value, naming the file and the key.

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
raises. Settings are read from the environment (and the config file, parsed again when it
changes) each time they are asked for, so a change takes effect at the next use.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
import warnings
from functools import lru_cache
from pathlib import Path
from types import FrameType
from typing import Any, Callable, NamedTuple, TypeVar

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
CONFIG = "PORTKERN_CONFIG"
#: Every setting a config file may hold (`config_key` names it there).
FILE_SETTINGS = (
    CACHE_DIR, CACHE_DISABLE, CACHE_MAXSIZE, COMPILE_TIMEOUT, COMPILE_MEMORY, COMPILE, BACKGROUND, EXECUTOR_MIN_BYTES,
    REMOTE_CACHE, REMOTE_MAX_VALUE, REMOTE_TIMEOUT, REMOTE_LOCK_S, TRUSTED_KEYS, REQUIRE_SIGNATURE, SIGNING_KEY, ROLE,
)
#: Settings whose relative paths in a config file are relative to its directory.
_PATH_SETTINGS = (CACHE_DIR, TRUSTED_KEYS, SIGNING_KEY)
#: The config file's name in the user config dir.
CONFIG_FILE = "portkern.toml"
#: A config file larger than this is not read.
MAX_CONFIG_BYTES = 1 << 20

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


def format_size(n: float) -> str:
    """A byte count for people: `512 B`, `1.5 KiB`, `260.0 MiB`, `2.0 GiB` (powers of 1024)."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


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


# --- where a setting comes from: the environment, else the config file -------------------


class Given(NamedTuple):
    """A setting as given: where (`label`: the variable, or `FILE: key`), its text, and
    whether it was given at all."""

    label: str
    raw: str
    given: bool


def config_key(name: str) -> str:
    """The key of setting `name` in a config file (`PORTKERN_CACHE_MAXSIZE` -> `cache_maxsize`)."""
    return name.removeprefix("PORTKERN_").lower()


#: The application name of portkern's user directories.
APP = "portkern"


def config_file() -> Path | None:
    """The config file in use: the one `PORTKERN_CONFIG` names (set and empty: none), else
    `portkern.toml` in the user config dir when it exists."""
    if CONFIG in os.environ:
        named = os.environ[CONFIG].strip()
        return Path(named).expanduser() if named else None
    default = _default_config(os.environ.get("XDG_CONFIG_HOME"), os.environ.get("HOME"))
    return default if default.is_file() else None


@lru_cache(maxsize=4)
def _default_config(xdg_config_home: str | None, home: str | None) -> Path:
    """`portkern.toml` in the user config dir (which follows these two variables)."""
    return user_dir("config") / CONFIG_FILE


def user_dir(kind: str) -> Path:
    """portkern's user `kind` directory ("cache" or "config"), as platformdirs names it
    (`user_cache_dir` / `user_config_dir`). Where its answer is XDG's plain rule (Linux, not
    Android: `$XDG_<KIND>_HOME` an absolute path, or unset with an absolute `HOME`:
    `~/.<kind>`), the path is formed here, so that a warm process does not import platformdirs
    (and the tempfile and shutil modules it imports); `tests/test_config_file.py` holds the two
    equal. Every other case is platformdirs' answer."""
    if sys.platform == "linux" and "ANDROID_DATA" not in os.environ:
        given = os.environ.get(f"XDG_{kind.upper()}_HOME")
        home = os.environ.get("HOME", "")
        if given is not None and os.path.isabs(given):
            return Path(given) / APP
        if given is None and os.path.isabs(home):
            return Path(home) / f".{kind}" / APP
    import platformdirs

    found = platformdirs.user_cache_dir if kind == "cache" else platformdirs.user_config_dir
    return Path(found(APP, appauthor=False))


def _file_values() -> dict[str, Given]:
    """The settings the config file holds, each warning about it given once."""
    named = CONFIG in os.environ
    path = config_file() if named else _default_config(os.environ.get("XDG_CONFIG_HOME"), os.environ.get("HOME"))
    if path is None:
        return {}
    try:
        st = os.stat(path)
        if not named and not stat.S_ISREG(st.st_mode):
            return {}
    except OSError as exc:
        if not named:  # no portkern.toml in the user config dir: none is used
            return {}
        warn(CONFIG if CONFIG in os.environ else "config file", str(path), f"cannot be read ({exc.strerror or exc}); no config file is used")
        return {}
    values, problems = _parsed(str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    for label, value, consequence in problems:
        warn(label, value, consequence)
    return values


@lru_cache(maxsize=4)
def _parsed(path: str, mtime_ns: int, size: int, inode: int) -> tuple[dict[str, Given], tuple[tuple[str, str, str], ...]]:
    """The settings of a config file (by its identity, so a changed file is parsed again) and
    the problems found in it, as (label, value, consequence)."""
    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:  # pyproject.toml requires tomli there
        import tomli as toml  # type: ignore[import-not-found, unused-ignore]
    where = Path(path)
    try:
        with open(where, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            return {}, ((path, f"{size} bytes", f"is larger than {MAX_CONFIG_BYTES} bytes; its settings are not used"),)
        document: Any = toml.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, toml.TOMLDecodeError) as exc:
        problem = exc.strerror if isinstance(exc, OSError) else str(exc)
        return {}, ((CONFIG if CONFIG in os.environ else "config file", path, f"is not a readable TOML file ({problem}); its settings are not used"),)
    table = document
    if where.name == "pyproject.toml":
        table = document.get("tool", {}).get("portkern") if isinstance(document.get("tool"), dict) else None
        if not isinstance(table, dict):
            return {}, ((CONFIG if CONFIG in os.environ else "config file", path, "has no [tool.portkern] table; no setting is read from it"),)
    known = {config_key(name): name for name in FILE_SETTINGS}
    values: dict[str, Given] = {}
    problems: list[tuple[str, str, str]] = []
    for key, value in table.items():
        label = f"{path}: {key}"
        name = known.get(key)
        if name is None:
            problems.append((label, repr(value)[:80], f"is not a portkern setting (known: {', '.join(sorted(known))}); ignored"))
            continue
        raw = _file_text(value, name, where.parent)
        if raw is None:
            problems.append((label, repr(value)[:80], "is not a string, number or boolean; ignored"))
            continue
        values[name] = Given(label, raw, True)
    return values, tuple(problems)


def _file_text(value: Any, name: str, directory: Path) -> str | None:
    """A config file value as the environment would spell it (None: not a usable type)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 2**63 else repr(value)
    if name == CACHE_DIR and isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = os.pathsep.join(value)
    if not isinstance(value, str):
        return None
    if name not in _PATH_SETTINGS:
        return value
    parts = value.split(os.pathsep) if name == CACHE_DIR else [value]
    return os.pathsep.join(str(directory / Path(p.strip()).expanduser()) if p.strip() else p for p in parts)


def given(name: str) -> Given:
    """Setting `name` as given: in the environment (set, even empty), else in the config file."""
    if name in os.environ:
        return Given(name, os.environ[name], True)
    return _file_values().get(name) or Given(name, "", False)


def _raw(name: str) -> str:
    return given(name).raw


def text(name: str) -> str:
    """The setting `name` as given, stripped ("" when unset)."""
    return _raw(name).strip()


def flag(name: str, default: bool = False, unreadable: bool | None = None) -> bool:
    """A boolean setting: 1/0, true/false, yes/no, on/off (any case); unset or empty is
    `default`, anything else is one warning and `default` (`unreadable` instead where given:
    a security setting fails closed)."""
    label, raw, _ = given(name)
    value = raw.strip().lower()
    if not value:
        return default
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    used = default if unreadable is None else unreadable
    what = f"using the default ({'on' if used else 'off'})" if used == default else f"treated as {'on' if used else 'off'}"
    warn(label, raw, f"is not one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}; {what}")
    return used


_Number = TypeVar("_Number", int, float)


def _bounded(
    name: str, read: Callable[[str], float], default: _Number, low: float, high: _Number, show: Callable[[float], str], what: str, *, above: bool = False
) -> _Number:
    """Setting `name` read by `read`; `default` when unset or unusable (one warning), `high`
    when larger (one warning). `low` is the smallest allowed value (excluded when `above`)."""
    label, raw, _ = given(name)
    if not raw.strip():
        return default
    try:
        value = read(raw)
    except SettingError:
        warn(label, raw, f"is not {what}; using the default {show(default)}")
        return default
    if value < low or (above and value == low):
        warn(label, raw, f"must be {'more than' if above else 'at least'} {show(low)}; using the default {show(default)}")
        return default
    if value > high:
        warn(label, raw, f"is more than the largest allowed, {show(high)}; using {show(high)}")
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
    label, raw, is_given = given(CACHE_DIR)
    if is_given and not raw.strip():
        warn(label, raw, "is empty; using the default cache directory")
    return tuple(part for part in raw.split(os.pathsep) if part.strip())


def cache_disabled() -> bool:
    """`PORTKERN_CACHE_DISABLE`: no cache at all."""
    return flag(CACHE_DISABLE)


def cache_max_size() -> int:
    """`PORTKERN_CACHE_MAXSIZE` in bytes; below one entry it warns that nothing will be kept."""
    value = _size_setting(CACHE_MAXSIZE, DEFAULT_CACHE_MAXSIZE, LARGEST_CACHE_MAXSIZE)
    if value < SMALLEST_ENTRY:
        shown = given(CACHE_MAXSIZE)
        warn(shown.label, shown.raw, f"is smaller than any cache entry (none is below {SMALLEST_ENTRY} bytes): nothing will be kept in the cache")
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
    label, raw, _ = given(COMPILE)
    value = raw.strip().lower()
    if not value:
        return COMPILE_AUTO
    if value in (COMPILE_AUTO, COMPILE_NEVER):
        return value
    warn(label, raw, f"is not {COMPILE_AUTO!r} or {COMPILE_NEVER!r}; using the default ({COMPILE_AUTO})")
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

