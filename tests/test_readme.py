"""The README's library snippet runs as written: detect -> plan -> install -> verify for ggml."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_snippet_installs_and_verifies_the_ggml_runtime(tmp_path, ggml_cpu_build):
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### From Python"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    # the machine's local build is cached by the session fixture, so this installs without compiling
    env = {**os.environ, "ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache")}
    env.pop("ACCELSTACK_MANIFESTS", None)
    proc = subprocess.run([sys.executable, "-c", snippet + "\nassert result.ok, result.reason\nprint('SNIPPET-OK', summary.receipt.id)"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "SNIPPET-OK" in proc.stdout and "verify" in proc.stdout
    assert (tmp_path / "home" / "active.json").is_file()
