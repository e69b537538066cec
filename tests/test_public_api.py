"""The public API an app embeds: the README's snippet runs as written, names resolve in any order."""
from __future__ import annotations

import subprocess
import sys

import pytest


def test_public_names_resolve_to_the_functions_and_types():
    code = (
        "import accelstack.detect.report, accelstack.core.lifecycle, accelstack.engine.verification\n"  # submodules first
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
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
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
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
