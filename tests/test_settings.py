"""One settings module (`portkern.base.settings`): one meaning per size suffix, bounds on every
setting (a too-large value is clamped with a warning), one policy for a bad value (a warning
and the default), and no other module reading `PORTKERN_*` from the environment."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
from helpers import assert_example, assert_matches

import portkern
from portkern.base import settings, signing
from portkern.base.errors import KeyFileError, SettingError
from portkern.base.settings import SettingWarning
from portkern.cache.config import CacheConfig, from_env
from portkern.cache.store import Store
from portkern.examples.reference import EXAMPLES
from portkern.jit import workers

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "base", "portable", "jit", "cache", "tuner", "schemas", "examples")


def setting_warnings(action):
    """`action()` and the messages of the `SettingWarning`s it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = action()
    return result, [str(w.message) for w in caught if issubclass(w.category, SettingWarning)]


def run_cold(bundle_path, tmp_path, rng):
    """A cold `kernel()` in an empty cache, checked against NumPy."""
    kernel = portkern.load(bundle_path, store=Store(CacheConfig(tmp_path / "cache" / "v1", 1 << 30, False))).kernel("gemm_rowsum")
    assert_example(kernel, rng, "gemm_rowsum")
    return kernel


@pytest.mark.parametrize(
    "text, value",
    [("1000", 1000), ("2KB", 2000), ("2k", 2000), ("2KiB", 2048), ("1.5G", 1_500_000_000), ("4G", 4_000_000_000),
     ("4GB", 4_000_000_000), ("4GiB", 4_294_967_296), ("4gib", 4_294_967_296), ("512MiB", 512 << 20), ("3 M", 3_000_000),
     ("1T", 10**12), ("1Ti", 1 << 40), ("inf", settings.LARGEST_SIZE)],
)
def test_each_size_suffix_has_one_meaning(text, value):
    assert settings.parse_size(text) == value


@pytest.mark.parametrize("text", ["lots", "-1", "1e9", "4X", "", "nan", "G"])
def test_what_is_not_a_size_is_a_setting_error(text):
    with pytest.raises(SettingError, match="cannot read size"):
        settings.parse_size(text)


@pytest.mark.parametrize("text, seconds", [("45", 45.0), ("1.5", 1.5), ("250ms", 0.25), ("45s", 45.0), ("90m", 5400.0), ("12h", 43200.0), ("30d", 2_592_000.0), ("1w", 604_800.0)])
def test_durations_parse(text, seconds):
    assert settings.parse_duration(text) == seconds


@pytest.mark.parametrize("text, value", [("4G", 4_000_000_000), ("4GiB", 4_294_967_296)])
def test_a_size_means_the_same_for_the_cache_and_for_compile_memory(monkeypatch, text, value):
    monkeypatch.setenv(settings.CACHE_MAXSIZE, text)
    monkeypatch.setenv(settings.COMPILE_MEMORY, text)
    (config, memory), messages = setting_warnings(lambda: (from_env(), workers.memory_bytes()))
    assert config.max_size == memory == value and messages == []


@pytest.mark.parametrize(
    "name, value, bound",
    [(settings.COMPILE_TIMEOUT, "inf", settings.LARGEST_COMPILE_TIMEOUT_S),
     (settings.COMPILE_TIMEOUT, "3000000", settings.LARGEST_COMPILE_TIMEOUT_S),
     (settings.COMPILE_MEMORY, "inf", settings.LARGEST_COMPILE_MEMORY)],
)
def test_a_too_large_compile_bound_is_clamped_and_a_cold_kernel_works(examples_bundle, tmp_path, rng, monkeypatch, name, value, bound):
    monkeypatch.setenv(name, value)
    with pytest.warns(SettingWarning, match=f"{name}='{value}' is more than the largest allowed"):
        kernel = run_cold(examples_bundle, tmp_path, rng)
    assert kernel.origin == "finalized"
    in_force = workers.timeout_s() if name == settings.COMPILE_TIMEOUT else workers.memory_bytes()
    assert in_force == bound


@pytest.mark.parametrize(
    "name, value, read, bound",
    [(settings.CACHE_MAXSIZE, "inf", lambda: from_env().max_size, settings.LARGEST_CACHE_MAXSIZE),
     (settings.REMOTE_MAX_VALUE, "1GiB", settings.remote_max_value, settings.LARGEST_REMOTE_MAX_VALUE),
     (settings.REMOTE_TIMEOUT, "infinity", settings.remote_timeout_s, settings.LARGEST_REMOTE_TIMEOUT_S),
     (settings.REMOTE_LOCK_S, "400d", settings.remote_lock_s, settings.LARGEST_REMOTE_LOCK_S)],
)
def test_every_bounded_setting_clamps_with_one_warning(monkeypatch, name, value, read, bound):
    monkeypatch.setenv(name, value)
    result, messages = setting_warnings(read)
    assert result == bound
    assert len(messages) == 1 and messages[0].startswith(f"{name}={value!r} is more than the largest allowed")


@pytest.mark.parametrize(
    "name, value, read, default",
    [(settings.CACHE_MAXSIZE, "2 lightyears", lambda: from_env().max_size, settings.DEFAULT_CACHE_MAXSIZE),
     (settings.COMPILE_TIMEOUT, "0", workers.timeout_s, settings.DEFAULT_COMPILE_TIMEOUT_S),
     (settings.COMPILE_TIMEOUT, "nan", workers.timeout_s, settings.DEFAULT_COMPILE_TIMEOUT_S),
     (settings.COMPILE_MEMORY, "-5G", workers.memory_bytes, settings.DEFAULT_COMPILE_MEMORY),
     (settings.REMOTE_MAX_VALUE, "0", settings.remote_max_value, settings.DEFAULT_REMOTE_MAX_VALUE),
     (settings.REMOTE_TIMEOUT, "fast", settings.remote_timeout_s, settings.DEFAULT_REMOTE_TIMEOUT_S),
     (settings.REMOTE_LOCK_S, "-3", settings.remote_lock_s, settings.DEFAULT_REMOTE_LOCK_S),
     (settings.BACKGROUND, "maybe", settings.background, True),
     (settings.COMPILE, "sometimes", settings.compile_mode, settings.COMPILE_AUTO),
     (settings.CACHE_DISABLE, "perhaps", lambda: from_env().disabled, False)],
)
def test_a_bad_value_is_one_warning_and_the_default(monkeypatch, name, value, read, default):
    monkeypatch.setenv(name, value)
    result, messages = setting_warnings(read)
    assert result == default
    assert len(messages) == 1 and messages[0].startswith(f"{name}={value!r}") and "default" in messages[0]
    again, messages = setting_warnings(read)
    assert again == default and messages == []  # once per process


@pytest.mark.parametrize("value", ["0", "1"])
def test_a_cache_size_below_one_entry_warns_that_nothing_will_be_kept(monkeypatch, value):
    monkeypatch.setenv(settings.CACHE_MAXSIZE, value)
    config, messages = setting_warnings(from_env)
    assert config.max_size == int(value)
    assert len(messages) == 1 and "nothing will be kept" in messages[0]


def test_with_a_cache_below_one_entry_nothing_is_kept(examples_bundle, tmp_path, rng, monkeypatch):
    monkeypatch.setenv(settings.CACHE_MAXSIZE, "1000")
    config, messages = setting_warnings(lambda: from_env(tmp_path / "cache"))
    assert len(messages) == 1 and "nothing will be kept" in messages[0]
    example = EXAMPLES["gemm_rowsum"]
    inputs = example.inputs(rng)
    for _ in range(2):  # the second load finds nothing kept: it finalises again
        kernel = portkern.load(examples_bundle, store=Store(config)).kernel("gemm_rowsum")
        assert kernel.origin == "finalized"
        assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)


def test_an_unreadable_require_signature_fails_closed(monkeypatch):
    monkeypatch.setenv(settings.REQUIRE_SIGNATURE, "required")
    monkeypatch.delenv(settings.TRUSTED_KEYS, raising=False)
    with pytest.warns(SettingWarning, match="treated as on"), pytest.raises(KeyFileError, match="names no trusted key"):
        signing.from_env()


def _environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each read of one environment variable whose name is not a plain
    string outside `PORTKERN_*`: `os.environ.get(x)`, `os.environ[x]`, `x in os.environ`, `os.getenv(x)`."""
    def is_environ(node):
        return isinstance(node, ast.Attribute) and node.attr == "environ" or isinstance(node, ast.Name) and node.id == "environ"

    def suspect(name_node) -> bool:
        return not (isinstance(name_node, ast.Constant) and isinstance(name_node.value, str) and not name_node.value.startswith("PORTKERN_"))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop", "setdefault") and is_environ(node.func.value) and node.args and suspect(node.args[0]):
                found.append((node.lineno, ast.unparse(node)))
            if node.func.attr == "getenv" and node.args and suspect(node.args[0]):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and suspect(node.slice):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators) and suspect(node.left):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_only_the_settings_module_reads_portkern_settings_from_the_environment():
    settings_file = ROOT / "base" / "settings.py"
    files = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 50
    assert _environment_reads(ast.parse(settings_file.read_text())), "the detector finds the reads in the settings module"
    offenders = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in files if path != settings_file
                 for line, what in _environment_reads(ast.parse(path.read_text()))]
    assert offenders == []
