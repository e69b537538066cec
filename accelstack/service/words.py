"""An error in the service's own words: its JSON fields and what an HTTP client does, never the CLI's flags.

The core and the engine word their errors for the command line (``--control-image PNG``, "pass
--wait SECONDS"); the service's clients send JSON (``"control_image": "inputs/edges.png"``) and
cannot pass a flag. Every flag that is a job option becomes that option's name (``--init-image PATH``
-> ``init_image``), and the hint of an action a client takes differently (waiting for the home, a
forced reinstall) is said as the client does it.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict

from .. import core
from ..errors import AccelstackError, Action

__all__ = ["JOB_OPTIONS", "SERVICE_ACTION_WORDS", "in_service_words", "service_hint", "translate"]

#: The options jobs take (docs/serve.md's table): a CLI flag naming one of them becomes its name.
JOB_OPTIONS = frozenset({"model", "prompt", "stack", "backend", "force", "dry_run", "requirements", "families", "lora_dir",
                         "embeddings_dir", "diffusion_model", "vae", "clip_l", "clip_g", "t5xxl", "llm", "taesd",
                         "control_net", "init_image", "control_image"}
                        | {f.name for f in dataclasses.fields(core.GenerateRequest)})
# "--init-image PATH", "--lora-dir", "--weight-type default": the flag, with the metavar that may follow it
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?: (?:PATH|PNG|FILE|DIR|NAME|N|S|SECONDS)\b)?")
#: What a client of the service does for an action the CLI takes with a flag or a command.
SERVICE_ACTION_WORDS: Dict[str, str] = {
    Action.WAIT.value: ("another accelstack process is changing the runtime home: start the job again once it has finished "
                        "(the service runs its own jobs one at a time; a job does not wait for another process)"),
    Action.REINSTALL.value: 'start an install job with {"force": true}',
    Action.RETRY.value: "start the job again",
}


def in_service_words(text: str) -> str:
    """``text`` with every CLI flag that is a job option written as that option (``--control-image PNG``
    -> ``control_image``); other flags stay as they are (they name the CLI, as in "accelstack install --force")."""
    def option(m: re.Match[str]) -> str:
        name = m.group(1).replace("-", "_")
        return name if name in JOB_OPTIONS else m.group(0)

    return _FLAG.sub(option, text or "")


def service_hint(exc: AccelstackError, hint: str) -> str:
    """``hint`` (the document's) for a client of the service: in the service's words, and where the action is
    one the client takes its own way, ``exc``'s own hint with what the client does (not the CLI's step)."""
    words = SERVICE_ACTION_WORDS.get(exc.action.value, "")
    if not words:
        return in_service_words(hint)
    return "; ".join(p for p in (in_service_words(exc.hint or ""), words) if p)


def translate(doc: Dict[str, Any], exc: AccelstackError) -> Dict[str, Any]:
    """``doc`` (an error document) with its message and hint in the service's words."""
    out = dict(doc)
    out["message"] = in_service_words(str(doc.get("message", "")))
    out["hint"] = service_hint(exc, str(doc.get("hint") or ""))
    return out
