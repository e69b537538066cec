"""Whether a server can be reached at all: the name resolves, and a TCP connection opens.

The installer asks when pip failed without saying why (pip with ``PIP_RETRIES=0`` hides its
connection errors), so the error can say "the index's host does not resolve" instead of "pip
failed". It lives here because artifacts/ is the only code that talks to the network.
"""
from __future__ import annotations

import socket
import urllib.parse
from typing import Tuple

__all__ = ["host_problem"]


def host_problem(url: str, timeout: float = 5.0) -> Tuple[str, str]:
    """``(kind, cause)`` when the server at ``url`` (a package index) cannot be reached at all (its host does not
    resolve, or refuses or drops the connection), else ``("", "")``. Asked only when pip failed
    without saying why (``PIP_RETRIES=0`` hides connection errors), and not behind a proxy, where
    a direct connection proves nothing (``installer.pip_output.pip_failure``'s ``proxied``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "", ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return "dns", f"{parts.hostname}: {exc.strerror or exc}"
    except OSError:
        return "", ""
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except ConnectionRefusedError as exc:
        return "connection-refused", f"{parts.hostname}:{port}: {exc.strerror or exc}"
    except socket.timeout:
        return "timeout", f"{parts.hostname}:{port}: no answer within {timeout:.0f} s"
    except OSError as exc:
        return "unreachable", f"{parts.hostname}:{port}: {exc.strerror or exc}"
    return "", ""
