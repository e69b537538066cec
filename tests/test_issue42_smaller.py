"""Issue 42, item 12 (the parts that are the CLI's words): `status --help` offered install options."""
from __future__ import annotations

from cli_helpers import run_cli


def test_status_help_offers_no_install_options():
    rc, out, err = run_cli(["status", "--help"])
    assert rc == 0, err
    assert "--no-build" not in out and "to install from" not in out, out
    assert "--manifest URL" in out and "look for upgrades in" in out  # what status asks the manifests
