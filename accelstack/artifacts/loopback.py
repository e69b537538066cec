"""One request to a service on this machine's loopback: how a command in another process asks a running
``accelstack serve`` to release its loaded worker (core/held_workers.py, issue 46). It lives here because
artifacts/ is the only code below the service that talks HTTP."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict

__all__ = ["delete_on_loopback"]

MAX_ANSWER = 64 * 1024


def delete_on_loopback(port: int, path: str, token: str, timeout: float) -> Dict[str, Any]:
    """``DELETE http://127.0.0.1:<port><path>`` with the bearer ``token``; the JSON answer. ``ValueError``
    (an HTTP error status, an answer that is not a JSON object) or ``OSError`` (no one answers)."""
    req = urllib.request.Request(f"http://127.0.0.1:{int(port)}{path}", method="DELETE",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            doc = json.loads(resp.read(MAX_ANSWER).decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise ValueError(f"it answered HTTP {exc.code}") from None
    if not isinstance(doc, dict):
        raise ValueError("its answer is not a JSON object")
    return doc
