"""torch_check.py runs as a script in the runtime's interpreter, and Python puts a script's own folder first on
``sys.path``: a module beside it named like something torch or diffusers imports (accelstack's
engine/verification/kernels.py against Hugging Face's optional ``kernels`` package, which diffusers probes for)
was imported instead, and the diffusers step failed with "Failed to import diffusers.models.unets.unet_2d_condition"
(the full run of stop 50)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import accelstack.engine.verification.torch_check as torch_check


def test_a_module_beside_the_script_never_shadows_what_it_imports(tmp_path):
    here = Path(torch_check.__file__).resolve()
    (tmp_path / "probes").mkdir()
    shutil.copy(here.parents[1] / "probes" / "layout.py", tmp_path / "probes" / "layout.py")
    folder = tmp_path / "verification"
    folder.mkdir()
    script = folder / "torch_check.py"
    shutil.copy(here, script)
    (folder / "torch.py").write_text("raise RuntimeError('shadowed by the script folder')\n")
    res = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120, cwd=tmp_path)
    assert "shadowed by the script folder" not in res.stdout, res.stdout[-2000:]
