"""Issue 42, item 12 (the parts that are the CLI's words): `status --help` offered install options."""
from __future__ import annotations

from cli_helpers import run_cli


def test_status_help_offers_no_install_options():
    rc, out, err = run_cli(["status", "--help"])
    assert rc == 0, err
    assert "--no-build" not in out and "to install from" not in out, out
    assert "--manifest URL" in out and "look for upgrades in" in out  # what status asks the manifests


def test_detect_replay_says_what_the_capture_lacks_instead_of_placeholders():
    """`detect --replay` printed `Python ` blank, `CPU unknown: ? cores / ? threads` and a free-disk line at
    the live machine's home for a capture that recorded none of them."""
    from pathlib import Path

    from accelstack.settings import Settings

    capture = Path(__file__).parent / "fixtures" / "captures" / "linux-nvidia-rtx5090-rtx4090-580"
    rc, out, err = run_cli(["detect", "--replay", capture])
    assert rc == 0, err
    lines = out.splitlines()
    assert "Python   not in the capture" in lines and "CPU      not in the capture" in lines, lines[:6]
    assert "Memory   not in the capture" in lines, lines[:6]
    assert "? cores" not in out and str(Settings.resolve().home) not in out and "GeForce RTX 5090" in out
