"""The names the README promises import from the top-level package, in any import order."""
from __future__ import annotations

import subprocess
import sys


def test_public_names_resolve_to_the_functions_and_types():
    code = (
        "import accelstack.detect.report, accelstack.installer.flow\n"  # submodules first: must not shadow
        "from accelstack import detect, LiveSystem, ReplaySystem, resolve, Request, Manifests, Plan, fetch, ArtifactRef\n"
        "import inspect\n"
        "assert inspect.isfunction(detect) and inspect.isfunction(resolve) and inspect.isfunction(fetch), (detect, resolve, fetch)\n"
        "r = detect(LiveSystem())\n"
        "p = resolve(r, Request(stack='ggml'), Manifests.builtin())\n"
        "assert isinstance(p, Plan) and p.stack == 'ggml'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_unknown_name_is_an_attribute_error():
    import accelstack

    try:
        accelstack.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
