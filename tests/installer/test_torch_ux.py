"""Torch installs as a person meets them: package indexes for mirrors, pip's download progress as
events, pip's real failure named, and the torch engine's own packages in the plan.

pip runs for real, against a real HTTP index on 127.0.0.1 serving wheels these tests build; no
test downloads anything from the internet."""
from __future__ import annotations

from accelstack.installer.torch import PipCommands, redact, with_indexes
from accelstack.manifests.plan import PYTHON_PLACEHOLDER, Command, Plan
from accelstack.settings import ENV, Settings

PYTORCH = "https://download.pytorch.org/whl/cu128"
MIRROR = "https://mirror.example/simple"


def _pip(*args: str) -> Command:
    return Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", *args])


# -- package indexes --------------------------------------------------------------------------------


def test_index_settings_come_from_arguments_then_the_environment(tmp_path):
    env = {ENV["index_url"]: " https://env.example/simple ", ENV["extra_index_urls"]: "https://a.example/simple  https://b.example/simple"}
    s = Settings.resolve(home=tmp_path, env=env, os_name="linux")
    assert s.index_url == "https://env.example/simple"
    assert s.extra_index_urls == ["https://a.example/simple", "https://b.example/simple"]
    s = Settings.resolve(home=tmp_path, env=env, os_name="linux", index_url=MIRROR, extra_index_urls=["https://c.example/simple"])
    assert s.index_url == MIRROR and s.extra_index_urls == ["https://c.example/simple"]
    s = Settings.resolve(home=tmp_path, env={}, os_name="linux", extra_index_urls="https://one.example/simple")
    assert s.index_url is None and s.extra_index_urls == ["https://one.example/simple"]  # one string is one URL


def test_a_mirror_replaces_pypi_but_not_the_pytorch_index():
    commands = [_pip("torch==2.14.*", "--index-url", PYTORCH), _pip("diffusers>=0.30")]
    out = with_indexes(commands, MIRROR, ["https://extra.example/simple"])
    assert out[0].argv[-4:] == ["--index-url", PYTORCH, "--extra-index-url", "https://extra.example/simple"]
    assert out[0].argv.count("--index-url") == 1  # the CUDA build is published only on the PyTorch index
    assert out[1].argv[-4:] == ["--index-url", MIRROR, "--extra-index-url", "https://extra.example/simple"]
    assert commands[1].argv == _pip("diffusers>=0.30").argv  # the plan's own commands are not changed
    bundle = Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", "--no-index", "--find-links", "/b", "-r", "r.txt"])
    assert with_indexes([bundle], MIRROR, ["https://x.example"])[0].argv == bundle.argv  # no index: a bundle stays offline
    assert with_indexes(commands, None, [])[1].argv == commands[1].argv


def test_pip_commands_for_a_plan_use_the_settings(tmp_path):
    plan = Plan(stack="torch", summary="", commands=[_pip("torch==2.14.*")])
    s = Settings.resolve(home=tmp_path, env={}, os_name="linux", index_url=MIRROR, use_uv=True)
    source = PipCommands.for_plan(plan, s)
    assert source.use_uv and source.commands[0].argv[-2:] == ["--index-url", MIRROR]


def test_a_token_in_an_index_url_is_not_shown():
    assert redact(["pip", "--index-url", "https://me:s3cret@mirror.example/simple"]) == \
        ["pip", "--index-url", "https://me:***@mirror.example/simple"]
