"""Settings: one rule for every path and option, tested on replayed platform facts.

The rule (argument, then ``ACCELSTACK_*`` variable, then the platform's convention) is applied to
an explicit ``env`` and ``os_name``, so Windows and macOS layouts are checked here on Linux; on this
machine the defaults must be exactly platformdirs'.
"""
from __future__ import annotations

import os
from pathlib import Path, PureWindowsPath

import platformdirs
import pytest

from accelstack.errors import UsageError
from accelstack.settings import ENV, Settings, Timeouts, current_os

REPO = Path(__file__).resolve().parents[1]
PATH_FIELDS = ("home", "cache", "build_cache", "probe_cache", "config_file", "config_dir")
LINUX_ENV = {"HOME": "/home/ann"}


def win(path: Path) -> PureWindowsPath:
    """A Windows path resolved on this machine, compared as Windows compares it."""
    return PureWindowsPath(str(path))


# -- platform defaults, per OS ------------------------------------------------------------------


def test_windows_uses_localappdata():
    s = Settings.resolve(env={"LOCALAPPDATA": r"C:\Users\ann\AppData\Local", "USERPROFILE": r"C:\Users\ann"}, os_name="windows")
    local = PureWindowsPath(r"C:\Users\ann\AppData\Local")
    assert win(s.home) == local / "accelstack" == win(s.config_dir)
    assert win(s.cache) == local / "accelstack" / "Cache"
    assert win(s.build_cache) == local / "accelstack" / "Cache" / "builds"
    assert win(s.probe_cache) == local / "accelstack" / "Cache" / "probe"
    assert win(s.config_file) == local / "accelstack" / "config.yaml"
    assert win(s.rollback_state) == local / "accelstack" / "state" / "manifest-versions.json"


def test_windows_without_localappdata_falls_back_to_the_profile():
    s = Settings.resolve(env={"USERPROFILE": r"D:\Profiles\bob"}, os_name="windows")
    assert win(s.home) == PureWindowsPath(r"D:\Profiles\bob\AppData\Local\accelstack")
    assert win(Settings.resolve(env={}, os_name="windows").home) == PureWindowsPath(r"C:\Users\Default\AppData\Local\accelstack")


def test_macos_uses_library():
    s = Settings.resolve(env={"HOME": "/Users/ann", "XDG_DATA_HOME": "/ignored/on/macos"}, os_name="macos")
    support = Path("/Users/ann/Library/Application Support/accelstack")
    assert s.home == support == s.config_dir
    assert s.config_file == support / "config.yaml"
    assert s.cache == Path("/Users/ann/Library/Caches/accelstack")
    assert (s.build_cache, s.probe_cache) == (s.cache / "builds", s.cache / "probe")
    assert s.user_keys_dir == support / "trusted-keys"


def test_linux_defaults_follow_home():
    s = Settings.resolve(env=LINUX_ENV, os_name="linux")
    assert s.home == Path("/home/ann/.local/share/accelstack")
    assert s.cache == Path("/home/ann/.cache/accelstack")
    assert s.config_dir == Path("/home/ann/.config/accelstack")
    assert s.config_file == s.config_dir / "config.yaml"
    assert (s.build_cache, s.probe_cache) == (s.cache / "builds", s.cache / "probe")


def test_linux_follows_xdg_variables_and_ignores_relative_ones():
    env = {**LINUX_ENV, "XDG_DATA_HOME": "/data/ann", "XDG_CACHE_HOME": "/fast/cache", "XDG_CONFIG_HOME": "/etc/ann"}
    s = Settings.resolve(env=env, os_name="linux")
    assert (s.home, s.cache, s.config_dir) == (Path("/data/ann/accelstack"), Path("/fast/cache/accelstack"), Path("/etc/ann/accelstack"))
    relative = {**LINUX_ENV, "XDG_DATA_HOME": "relative/dir", "XDG_CACHE_HOME": " ", "XDG_CONFIG_HOME": ""}
    s = Settings.resolve(env=relative, os_name="linux")  # the XDG spec: a relative path is invalid, ignore it
    assert (s.home, s.cache, s.config_dir) == (Path("/home/ann/.local/share/accelstack"), Path("/home/ann/.cache/accelstack"),
                                               Path("/home/ann/.config/accelstack"))


def test_resolve_home_is_the_same_rule():
    """``resolve`` takes its home from ``resolve_home``; check the rule itself, per OS."""
    for env, os_name, expected in ((LINUX_ENV, "linux", "/home/ann/.local/share/accelstack"),
                                   ({**LINUX_ENV, ENV["home"]: "/srv/rt"}, "linux", "/srv/rt"),
                                   ({"HOME": "/Users/ann"}, "macos", "/Users/ann/Library/Application Support/accelstack"),
                                   ({"LOCALAPPDATA": r"C:\L"}, "windows", r"C:\L\accelstack")):
        home = Settings.resolve_home(env=env, os_name=os_name)
        assert home == Settings.resolve(env=env, os_name=os_name).home
        assert (win(home) == PureWindowsPath(expected)) if os_name == "windows" else home == Path(expected)
    # an argument beats the rule; the rule never reads the other variables (a capture records each read)
    bad = {**LINUX_ENV, ENV["offline"]: "not-a-flag"}
    assert Settings.resolve_home(env=bad, os_name="linux") == Path("/home/ann/.local/share/accelstack")
    assert Settings.resolve(env={**LINUX_ENV, ENV["home"]: "/srv/rt"}, os_name="linux", home="/x").home == Path("/x")


# -- precedence: argument > ACCELSTACK_* variable > platform default ------------------------------


@pytest.mark.parametrize("os_name, env", [("linux", LINUX_ENV), ("macos", {"HOME": "/Users/ann"}),
                                          ("windows", {"LOCALAPPDATA": r"C:\Users\ann\AppData\Local"})])
@pytest.mark.parametrize("field", PATH_FIELDS)
def test_precedence_for_every_path_field(field, os_name, env, tmp_path):
    default = getattr(Settings.resolve(env=env, os_name=os_name), field)
    from_env = getattr(Settings.resolve(env={**env, ENV[field]: "/from/variable"}, os_name=os_name), field)
    from_arg = getattr(Settings.resolve(env={**env, ENV[field]: "/from/variable"}, os_name=os_name, **{field: tmp_path}), field)
    assert from_env == Path("/from/variable") != default
    assert from_arg == tmp_path
    assert getattr(Settings.resolve(env={**env, ENV[field]: ""}, os_name=os_name), field) == default  # empty = unset
    assert getattr(Settings.resolve(env=env, os_name=os_name, **{field: None}), field) == default  # None = not given


def test_config_dir_holds_the_user_trusted_keys(tmp_path):
    assert Settings.resolve(env=LINUX_ENV, os_name="linux", config_dir=tmp_path).user_keys_dir == tmp_path / "trusted-keys"


def test_cache_moves_the_build_and_probe_caches_unless_they_are_named():
    s = Settings.resolve(env={**LINUX_ENV, ENV["cache"]: "/big/cache"}, os_name="linux")
    assert (s.build_cache, s.probe_cache) == (Path("/big/cache/builds"), Path("/big/cache/probe"))
    s = Settings.resolve(env={**LINUX_ENV, ENV["cache"]: "/big/cache", ENV["probe_cache"]: "/shared/probe"}, os_name="linux",
                         build_cache="/ci/builds")
    assert (s.build_cache, s.probe_cache) == (Path("/ci/builds"), Path("/shared/probe"))


def test_paths_expand_the_user():
    s = Settings.resolve(env={**LINUX_ENV, ENV["home"]: "~/rt"}, os_name="linux", cache="~/c")
    assert s.home == Path("~/rt").expanduser() and s.cache == Path("~/c").expanduser()
    assert "~" not in str(s.home)


def test_derived_paths_belong_to_the_home(tmp_path):
    s = Settings.resolve(env=LINUX_ENV, os_name="linux", home=tmp_path / "h")
    assert s.state_dir == tmp_path / "h" / "state"
    assert s.rollback_state == tmp_path / "h" / "state" / "manifest-versions.json"
    assert s.remembered == tmp_path / "h" / "settings.json"
    moved = s.replace(home=tmp_path / "other", cache=None)
    assert moved.rollback_state == tmp_path / "other" / "state" / "manifest-versions.json" and moved.cache == s.cache


# -- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("YES", True), (" on ", True),
                                             ("", False), ("0", False), ("false", False), ("No", False), ("off", False)])
def test_offline_flag(value, expected):
    assert Settings.resolve(env={**LINUX_ENV, ENV["offline"]: value}, os_name="linux").offline is expected


@pytest.mark.parametrize("value", ["2", "maybe", "offline", "-1"])
def test_a_bad_offline_flag_is_a_usage_error(value):
    with pytest.raises(UsageError) as err:
        Settings.resolve(env={**LINUX_ENV, ENV["offline"]: value}, os_name="linux")
    assert ENV["offline"] in err.value.message and repr(value.strip().lower()) in err.value.message
    assert err.value.exit_code == 2


def test_offline_argument_beats_the_variable():
    env = {**LINUX_ENV, ENV["offline"]: "1"}
    assert Settings.resolve(env=env, os_name="linux", offline=False).offline is False
    assert Settings.resolve(env={**LINUX_ENV, ENV["offline"]: "bad"}, os_name="linux", offline=True).offline is True
    assert Settings.resolve(env=env, os_name="linux").offline is True


def test_backend_manifests_and_keys_from_variables_and_arguments():
    env = {**LINUX_ENV, ENV["backend"]: " vulkan ", ENV["manifests"]: "https://a/m.json  https://b/m.json\n",
           ENV["trusted_keys"]: os.pathsep.join(["/keys/a.pub", "", "base64key"])}
    s = Settings.resolve(env=env, os_name="linux")
    assert s.backend == "vulkan"
    assert s.manifests == ["https://a/m.json", "https://b/m.json"]
    assert s.trusted_keys == ["/keys/a.pub", "base64key"]
    s = Settings.resolve(env=env, os_name="linux", backend="cpu", manifests="https://only/one.json", trusted_keys=[Path("/k.pub")])
    assert (s.backend, s.manifests, s.trusted_keys) == ("cpu", ["https://only/one.json"], ["/k.pub"])


def test_plain_options_and_unknown_names():
    s = Settings.resolve(env=LINUX_ENV, os_name="linux", insecure_unsigned=1, allow_build=0, timeouts=Timeouts(pip=5))
    assert s.insecure_unsigned is True and s.allow_build is False and s.timeouts.pip == 5
    assert Settings.resolve(env=LINUX_ENV, os_name="linux").allow_build is True
    with pytest.raises(TypeError, match="hoem"):
        Settings.resolve(env=LINUX_ENV, os_name="linux", hoem="/x")


# -- the live machine -----------------------------------------------------------------------------


@pytest.fixture
def no_accelstack_variables(monkeypatch):
    for name in ENV.values():
        monkeypatch.delenv(name, raising=False)


def test_live_defaults_are_platformdirs(no_accelstack_variables):
    pd = platformdirs.PlatformDirs("accelstack", appauthor=False)
    s = Settings.resolve()
    assert (s.home, s.cache, s.config_dir) == (Path(pd.user_data_dir), Path(pd.user_cache_dir), Path(pd.user_config_dir))
    assert s.build_cache == Path(pd.user_cache_dir) / "builds" and Settings.resolve_home() == s.home


@pytest.mark.skipif(current_os() == "windows", reason="Windows asks the shell for its folders, not the variables")
def test_the_replay_rule_matches_platformdirs_on_this_machine(no_accelstack_variables):
    """What a replay of this machine's environment resolves is what platformdirs answers live."""
    pd = platformdirs.PlatformDirs("accelstack", appauthor=False)
    s = Settings.resolve(env=dict(os.environ), os_name=current_os())
    assert (s.home, s.cache, s.config_dir) == (Path(pd.user_data_dir), Path(pd.user_cache_dir), Path(pd.user_config_dir))


def test_the_test_session_keeps_off_the_user_dirs():
    """tests/conftest.py: home, cache and config are the session's own; the probe is repo-local
    unless named; the input-keyed build cache stays shared."""
    pd = platformdirs.PlatformDirs("accelstack", appauthor=False)
    s = Settings.resolve()
    for path in (s.home, s.cache, s.config_file):
        assert not {Path(pd.user_data_dir), Path(pd.user_cache_dir), Path(pd.user_config_dir)} & {path, *path.parents}
    if os.environ.get(ENV["probe_cache"]) == str(REPO / ".cache" / "probe"):
        assert REPO / ".cache" in s.probe_cache.parents


# -- channels ----------------------------------------------------------------------------------


def test_channels_from_the_app_and_the_channel_names_from_arguments_or_the_environment(tmp_path):
    from accelstack.settings import Channel

    s = Settings.resolve(env={"HOME": str(tmp_path), "ACCELSTACK_CHANNEL": "beta  stable"}, os_name="linux",
                         channels=[Channel("stable", "https://a/m.json"), {"name": "beta", "url": "https://b/m.json",
                                                                             "mirrors": ["https://c/m.json"], "keys": []}])
    assert [c.name for c in s.channels] == ["stable", "beta"] and s.channels[1].mirrors == ["https://c/m.json"]
    assert s.channel == ["beta", "stable"]
    assert Settings.resolve(env={"HOME": str(tmp_path), "ACCELSTACK_CHANNEL": "x"}, os_name="linux", channel="y").channel == ["y"]
    assert s.channels_file == s.config_dir / "channels.json"
    with pytest.raises(UsageError, match="a channel needs a name and a manifest URL"):
        Settings.resolve(env={"HOME": str(tmp_path)}, os_name="linux", channels=[{"name": "x"}])
