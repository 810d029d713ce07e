"""The optional config file beside the environment (`portkern.base.settings`): `portkern.toml`
in the user config dir or the file `PORTKERN_CONFIG` names (a pyproject.toml's `[tool.portkern]`
table), keys named as the settings without `PORTKERN_` in lower case; the environment wins;
unknown keys and bad values warn like bad environment values."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import portkern
from portkern.base import settings
from portkern.base.errors import CompileForbiddenError
from portkern.base.settings import SettingWarning
from portkern.cache.config import CacheConfig, from_env
from portkern.cache.store import Store


def setting_warnings(action):
    """`action()` and the messages of the `SettingWarning`s it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = action()
    return result, [str(w.message) for w in caught if issubclass(w.category, SettingWarning)]


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Write a config file (`portkern.toml` unless `name` says otherwise) and point
    `PORTKERN_CONFIG` at it."""

    def write(text: str, name: str = "portkern.toml"):
        path = tmp_path / "etc" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        monkeypatch.setenv("PORTKERN_CONFIG", str(path))
        return path

    for name in settings.FILE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return write


def test_a_file_setting_changes_behaviour(config, examples_bundle, tmp_path):
    config('compile = "never"\ncache_maxsize = "2GB"\nremote_timeout = 5\nbackground = false\ncache_dir = "cache-here"\n')
    assert settings.cache_max_size() == 2_000_000_000 and settings.remote_timeout_s() == 5.0
    assert settings.background() is False
    assert from_env().directory == tmp_path / "etc" / "cache-here" / "v1"  # relative to the file's directory
    store = Store(CacheConfig(tmp_path / "cache", 1 << 30, False))
    with pytest.raises(CompileForbiddenError, match="compiling is turned off"):
        portkern.load(examples_bundle, store=store).kernel("gemm_bias_relu")


def test_the_environment_wins_over_the_file(config, monkeypatch):
    config('compile = "never"\ncache_maxsize = "2GB"\nrequire_signature = true\n')
    monkeypatch.setenv("PORTKERN_COMPILE", "auto")
    monkeypatch.setenv("PORTKERN_CACHE_MAXSIZE", "3GB")
    assert settings.compile_mode() == "auto" and settings.cache_max_size() == 3_000_000_000
    assert settings.require_signature() is True
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "")  # set, even empty: the file's value is not read
    assert settings.require_signature() is False


def test_unknown_keys_and_bad_values_warn_naming_the_file(config):
    path = config('cache_max_size = "2GB"\nremote_timeout = "soon"\nrole = ["reader"]\nremote_lock_s = 10\n')
    value, warned = setting_warnings(settings.remote_timeout_s)
    assert value == settings.DEFAULT_REMOTE_TIMEOUT_S
    assert any(m.startswith(f"{path}: cache_max_size=") and "is not a portkern setting" in m for m in warned), warned
    assert any(m.startswith(f"{path}: role=") and "is not a string, number or boolean" in m for m in warned), warned
    assert any(m.startswith(f"{path}: remote_timeout='soon' is not a duration") and "using the default" in m for m in warned)
    assert settings.remote_lock_s() == 10.0 and settings.role() == ""  # the good keys still count


def test_a_pyproject_gives_its_tool_portkern_table(config):
    config('[project]\nname = "app"\n\n[tool.portkern]\ncache_maxsize = "5MiB"\ncompile_timeout = "2m"\n', "pyproject.toml")
    assert settings.cache_max_size() == 5 << 20 and settings.compile_timeout_s() == 120.0
    path = config('[project]\nname = "other"\n', "pyproject.toml")
    value, warned = setting_warnings(settings.cache_max_size)
    assert value == settings.DEFAULT_CACHE_MAXSIZE
    assert any(str(path) in m and "has no [tool.portkern] table" in m for m in warned), warned


def test_a_file_that_is_not_toml_or_missing_warns_and_is_not_used(config, tmp_path, monkeypatch):
    path = config("cache_maxsize = \n")
    value, warned = setting_warnings(settings.cache_max_size)
    assert value == settings.DEFAULT_CACHE_MAXSIZE and any(str(path) in m and "is not a readable TOML file" in m for m in warned)
    monkeypatch.setenv("PORTKERN_CONFIG", str(tmp_path / "missing.toml"))
    value, warned = setting_warnings(settings.cache_max_size)
    assert value == settings.DEFAULT_CACHE_MAXSIZE and any("missing.toml" in m and "cannot be read" in m for m in warned)


def test_the_default_file_is_portkern_toml_in_the_user_config_dir(tmp_path, monkeypatch):
    for name in settings.FILE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PORTKERN_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert settings.config_file() is None and settings.cache_max_size() == settings.DEFAULT_CACHE_MAXSIZE
    (tmp_path / "portkern").mkdir()
    (tmp_path / "portkern" / "portkern.toml").write_text('cache_maxsize = "7MB"\n')
    assert settings.config_file() == tmp_path / "portkern" / "portkern.toml"
    assert settings.cache_max_size() == 7_000_000
    (tmp_path / "portkern" / "portkern.toml").write_text('cache_maxsize = "8MB"  # changed\n')
    assert settings.cache_max_size() == 8_000_000  # a changed file counts at the next use
    monkeypatch.setenv("PORTKERN_CONFIG", "")  # set and empty: no config file
    assert settings.cache_max_size() == settings.DEFAULT_CACHE_MAXSIZE


@pytest.mark.parametrize(
    ("xdg", "home"),
    [(None, "/home/user"), ("/srv/xdg", "/home/user"), ("/srv/xdg/", "/home/user/"), ("relative/dir", "/home/user"),
     ("", "/home/user"), ("   ", "/home/user"), (None, "relative-home")],
    ids=["home", "xdg", "trailing-slashes", "xdg-relative", "xdg-empty", "xdg-blank", "home-relative"],
)
@pytest.mark.parametrize("kind", ["cache", "config"])
def test_the_user_directories_are_platformdirs_ones(monkeypatch, kind, xdg, home):
    """portkern's user cache and config directories are platformdirs' answers, whatever the
    XDG variable and HOME say (the plain cases are formed without importing platformdirs)."""
    platformdirs = pytest.importorskip("platformdirs")
    variable = f"XDG_{kind.upper()}_HOME"
    monkeypatch.setenv("HOME", home)
    if xdg is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, xdg)
    asked = platformdirs.user_cache_dir if kind == "cache" else platformdirs.user_config_dir
    try:
        expected = Path(asked("portkern", appauthor=False))
    except RuntimeError:  # a platformdirs that refuses a relative HOME refuses it for portkern too
        with pytest.raises(RuntimeError):
            settings.user_dir(kind)
        return
    assert settings.user_dir(kind) == expected
