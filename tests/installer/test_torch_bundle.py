"""Torch offline bundles: the torch plan's wheels downloaded with pip into one file, then installed
into a fresh venv by a pip that can reach nothing but the bundle (no index, no find-links, no pip
configuration), checked and recorded as an online torch install; tampered or hostile bundles refused
before pip runs.

The bundle is made from the CPU build of torch 2.13 in the wheel folder the tests fill once
(tests/wheelhouse.py); where that wheel cannot be downloaded the install tests skip with pip's reason.
"""
from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from accelstack.artifacts import HashMismatchError
from accelstack.core.bundles import BundleError, install_bundle
from accelstack.core.verifiers import import_verifier
from accelstack.installer.errors import TorchInstallError
from accelstack.installer.home import Home
from accelstack.installer.pip_commands import download_commands, hashed_requirements, local_install_command
from accelstack.manifests.plan import PYTHON_PLACEHOLDER
from accelstack.settings import Settings

from installer_helpers import cli_env, result_of, run_cli

PIN = "torch==2.13.*"


@pytest.fixture(scope="module")
def torch_bundle(module_tmp, torch_cpu_wheels):
    """A torch bundle made from this machine's plan, its wheels downloaded from the tests' wheel folder alone."""
    root = module_tmp / "online"
    root.mkdir()
    env = cli_env(root / "home", root / "cache", {"ACCELSTACK_CONFIG_DIR": str(root / "config"), **torch_cpu_wheels})
    proc = run_cli(["bundle", "create", "--stack", "torch", "--venv", str(root / "venv"), "-o", str(root / "torch.tar"),
                    "--json", PIN], env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (root / "venv").exists()  # making a bundle touches no environment
    made = result_of(proc)
    return Path(made["path"]), made


def _offline_env(tmp_path: Path) -> dict:
    """The CLI's environment with pip cut off from every source but the bundle."""
    env = cli_env(tmp_path / "home", tmp_path / "cache", {"ACCELSTACK_CONFIG_DIR": str(tmp_path / "config"),
                                                         "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null"})
    env.pop("PIP_FIND_LINKS", None)
    env.pop("PIP_EXTRA_INDEX_URL", None)
    return env


def test_a_torch_bundle_installs_into_a_fresh_venv_from_the_bundle_alone(torch_bundle, tmp_path):
    bundle, made = torch_bundle
    assert made["stack"] == "torch" and made["targets"] == ["cpu"] and made["python"] == "%d.%d" % sys.version_info[:2]
    assert any(n.startswith("torch-2.13.0+cpu-") for n in made["artifacts"]) and len(made["artifacts"]) > 1  # and its deps
    assert made["sha256"] == hashlib.sha256(bundle.read_bytes()).hexdigest() and made["bytes"] == bundle.stat().st_size
    with tarfile.open(bundle) as tf:
        index = json.loads(tf.extractfile("accelstack-bundle.json").read())
        names = sorted(tf.getnames())
    assert index["stack"] == "torch" and index["plan"]["variant"] == "cpu" and index["plan"]["torch_version"] == "2.13"
    assert sorted(w["name"] for w in index["wheels"]) == sorted(made["artifacts"])
    assert names == sorted(["accelstack-bundle.json"] + [f"artifacts/{w['sha256']}" for w in index["wheels"]])

    venv = tmp_path / "venv"
    env = _offline_env(tmp_path)
    proc = run_cli(["install", "--bundle", str(bundle), "--venv", str(venv), "--json"], env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = result_of(proc)
    assert out["changed"] is True and out["stack"] == "torch"
    argv = out["plan"]["commands"][0]["argv"]
    assert "--no-index" in argv and "--require-hashes" in argv
    receipt = Home(tmp_path / "home").read_receipt(out["runtime"])
    assert receipt.stack == "torch" and receipt.backend == "cpu" and receipt.manifest_source == "bundle:torch.tar"
    assert receipt.verification.ok and receipt.verification.verdict == "PASS", receipt.verification.reason
    assert receipt.path == str(venv / "bin" / "python")
    version = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                             stdout=subprocess.PIPE, text=True, check=True, timeout=300).stdout.strip()
    assert version.startswith("2.13")
    status = result_of(run_cli(["status", "--json"], env))["stacks"]
    assert next(x for x in status if x["stack"] == "torch")["active"] == out["runtime"]
    # the torch engine's packages came with it, so `generate --backend torch` has what it imports
    assert any(n.startswith("diffusers-") for n in made["artifacts"])
    assert "diffusers (" not in receipt.verification.reason


def _rewrite(src: Path, dest: Path, change) -> Path:
    """A copy of the bundle ``src`` with each member's bytes passed through ``change(name, data)``."""
    with tarfile.open(src) as tin, tarfile.open(dest, "w") as tout:
        for m in tin:
            data = change(m.name, tin.extractfile(m).read())
            m.size = len(data)
            tout.addfile(m, io.BytesIO(data))
    return dest


def test_a_tampered_wheel_is_refused_before_pip_and_nothing_is_installed(torch_bundle, tmp_path):
    bundle, _ = torch_bundle
    with tarfile.open(bundle) as tf:
        index = json.loads(tf.extractfile("accelstack-bundle.json").read())
    small = min(index["wheels"], key=lambda w: w["size"])  # any wheel will do; the smallest is the cheapest to rewrite
    victim = f"artifacts/{small['sha256']}"

    def flip(name, data):
        return data[:100] + bytes([data[100] ^ 1]) + data[101:] if name == victim else data

    venv = tmp_path / "venv"
    s = Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", config_dir=tmp_path / "config", torch_venv=venv)
    with pytest.raises(HashMismatchError) as info:
        install_bundle(_rewrite(bundle, tmp_path / "bad.tar", flip), settings=s, verifier=import_verifier())
    assert small["name"] in info.value.message and info.value.expected == small["sha256"]
    assert not venv.exists()  # refused before any environment was made or pip ran
    assert Home(s.home).read_active().active == {}
    assert not list(s.cache.glob(".bundle-*"))  # the extracted wheels are gone

    # and pip itself, given the install command, takes no bytes but the hashed ones
    with tarfile.open(bundle) as tf:
        original = tf.extractfile(victim).read()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / small["name"]).write_bytes(flip(victim, original))
    req = tmp_path / "requirements.txt"
    req.write_text(hashed_requirements([(small["name"], small["sha256"])]))
    argv = [a.replace(PYTHON_PLACEHOLDER, sys.executable) for a in local_install_command(wheels, req).argv]
    proc = subprocess.run([*argv, "--dry-run", "--ignore-installed", "--no-deps"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode != 0 and "DO NOT MATCH THE HASHES" in proc.stdout, proc.stdout[-2000:]


def _torch_tar(path: Path, index: dict, files: dict) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, data in [("accelstack-bundle.json", json.dumps(index).encode()),
                           *((f"artifacts/{hashlib.sha256(d).hexdigest()}", d) for d in files.values())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_hostile_torch_bundle_indexes_are_refused_before_pip(tmp_path):
    wheel = b"not really a wheel"
    sha = hashlib.sha256(wheel).hexdigest()
    here = "%d.%d" % sys.version_info[:2]

    def index(**change) -> dict:
        doc = {"format": "accelstack-bundle", "version": 1, "stack": "torch", "python": here,
               "plan": {"variant": "cpu", "torch_version": "2.13", "requirements": [PIN]},
               "wheels": [{"name": "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "sha256": sha,
                           "size": len(wheel)}]}
        doc.update(change)
        return doc

    def entry(**change) -> list:
        return [{**index()["wheels"][0], **change}]

    cases = {
        "traversal": (index(wheels=entry(name="../../evil-1.0-py3-none-any.whl")), "not valid"),
        "subdirectory": (index(wheels=entry(name="a/torch-1.0-py3-none-any.whl")), "not valid"),
        "not-a-wheel": (index(wheels=entry(name="setup.py")), "not valid"),
        "bad-hash": (index(wheels=entry(sha256="../" * 20)), "not valid"),
        "twice": (index(wheels=entry() * 2), "listed twice"),
        "no-wheels": (index(wheels=[]), "not valid"),
        "python": (index(python="3.0"), "Python 3.0"),
        "absent-wheel": (index(wheels=entry(sha256="b" * 64)), "lacks the wheel"),
        "other-variant": (index(plan={"variant": "cu126", "torch_version": "2.13", "requirements": []}), "does not fit"),
    }
    for name, (doc, words) in cases.items():
        venv = tmp_path / name / "venv"
        s = Settings.resolve(home=tmp_path / name / "home", cache=tmp_path / name / "cache",
                             config_dir=tmp_path / name / "config", torch_venv=venv)
        with pytest.raises(BundleError) as info:
            install_bundle(_torch_tar(tmp_path / f"{name}.tar", doc, {"w": wheel}), settings=s, verifier=import_verifier())
        assert words in info.value.message, (name, info.value.message)
        assert not venv.exists(), name


def test_download_commands_carry_the_plans_index_and_the_targets_tags(tmp_path):
    plan = accelstack_plan()
    cmds = download_commands(plan, tmp_path, "3.12", ["manylinux_2_28_x86_64", "manylinux2014_x86_64"], pip_python="py")
    assert len(cmds) == len(plan.commands) == 1
    argv = cmds[0]
    assert argv[:6] == ["py", "-m", "pip", "download", "--dest", str(tmp_path)]
    assert "--only-binary=:all:" in argv and argv[argv.index("--python-version") + 1] == "3.12"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"] == ["manylinux_2_28_x86_64", "manylinux2014_x86_64"]
    assert argv[-3:] == [PIN, "--index-url", "https://download.pytorch.org/whl/cu126"]
    plan.commands[0].argv = ["uv", "pip", "install", PIN]  # anything but `{python} -m pip install` cannot be bundled
    with pytest.raises(TorchInstallError, match="not a pip install"):
        download_commands(plan, tmp_path, "3.12")


def accelstack_plan():
    """A CUDA torch plan made on paper (no machine needed): the plan's own pin and index carry into pip download."""
    from accelstack.manifests.plan import Command, Plan

    return Plan(stack="torch", summary="on paper", packages=[PIN], index_url="https://download.pytorch.org/whl/cu126",
                commands=[Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", PIN, "--index-url",
                                          "https://download.pytorch.org/whl/cu126"], "install")])
