"""The public API an app embeds: the README's snippet runs as written, names resolve in any order."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by this interpreter in a fresh process (imports start from nothing)."""
    return subprocess.run([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=120)


def test_public_names_resolve_to_the_functions_and_types():
    code = (
        "import accelstack.hardware.report, accelstack.core.installing, accelstack.engine.verification.probe_verify\n"  # submodules first
        "import accelstack, inspect\n"
        "for name in ('detect', 'plan', 'install', 'verify', 'status', 'repair', 'upgrade', 'rollback', 'generate', 'resolve', 'fetch'):\n"
        "    assert inspect.isfunction(getattr(accelstack, name)), name\n"
        "from accelstack.engine import verify, generate\n"
        "assert inspect.isfunction(verify) and inspect.isfunction(generate)\n"
        "r = accelstack.detect()\n"
        "p = accelstack.plan(r, stack='ggml')\n"
        "assert isinstance(p, accelstack.Plan) and p.stack == 'ggml'\n"
        "print('ok')\n"
    )
    out = _python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_unknown_name_is_an_attribute_error():
    import accelstack

    with pytest.raises(AttributeError, match="no_such_thing"):
        accelstack.no_such_thing  # noqa: B018


def test_importing_the_package_or_a_plan_loads_no_download_or_install_code():
    code = (
        "import sys, accelstack, accelstack.manifests.plan\n"
        "accelstack.detect\n"
        "bad = [m for m in sys.modules if m.startswith(('accelstack.artifacts', 'accelstack.installer', 'accelstack.engine', 'requests'))]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = _python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_detect_is_imported_on_first_use_and_stays_the_function_whatever_comes_first():
    """`import accelstack` no longer pays for detection's modules (50 ms on every command); the
    name is only the function: detection's modules live in `accelstack.hardware`."""
    code = (
        "import sys, inspect, accelstack\n"
        "assert 'accelstack.hardware' not in sys.modules and 'accelstack.core.detection' not in sys.modules\n"
        "assert inspect.isfunction(accelstack.detect)\n"
        "import accelstack.hardware.report\n"
        "from accelstack.hardware import system\n"
        "from accelstack import detect\n"
        "assert inspect.isfunction(accelstack.detect) and detect is accelstack.detect, accelstack.detect\n"
        "print('ok')\n"
    )
    out = _python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_version_is_printed_without_loading_the_commands():
    from accelstack import __version__

    code = (
        "import sys\n"
        "from accelstack.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "assert not [m for m in sys.modules if m.startswith('accelstack.commands.')], 'a command module was loaded'\n"
        "sys.exit(rc)\n"
    )
    for flag in ("-V", "--version"):
        out = _python(code, flag)
        assert out.returncode == 0 and out.stdout == f"accelstack {__version__}\n", out.stderr
