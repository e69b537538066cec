"""Where a package index publishes a file: read from its simple API (PEP 691 JSON or PEP 503 HTML).

A CUDA build's manifest names the NVIDIA runtime wheels it links by the URL the index serves them
at; that URL is taken from the index's own page for the package and accepted only when the
index's sha256 of the file is the one of the file pip downloaded, never guessed. The page is read
through :mod:`accelstack.artifacts` (the transport's https-only rule, the system trust store and a
size limit), like every other download.
"""
from __future__ import annotations

import json
import re
from typing import List, Optional, Tuple
from urllib.parse import urljoin

from ..artifacts.documents import fetch_page
from ..artifacts.errors import FetchError
from ..artifacts.transport import Transport
from ..errors import Action
from .errors import BuildError

__all__ = ["PYPI_SIMPLE", "SIMPLE_ACCEPT", "index_files", "published_url"]

PYPI_SIMPLE = "https://pypi.org/simple"
SIMPLE_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.2"  # PEP 691 JSON, else PEP 503 HTML


def published_url(package: str, filename: str, sha256: str, index_url: Optional[str], *,
                  transport: Optional[Transport] = None) -> str:
    """The URL the package index ``index_url`` (``Settings.index_url``; None: PyPI) serves
    ``filename`` at, read from its simple API page for ``package`` and accepted only when the
    index's sha256 of it is ``sha256``."""
    index = (index_url or PYPI_SIMPLE).rstrip("/")
    page = f"{index}/{re.sub(r'[-_.]+', '-', package).lower()}/"
    try:
        served = fetch_page(page, accept=SIMPLE_ACCEPT, transport=transport)
    except FetchError as exc:
        raise BuildError(f"cannot read {page} to find where {filename} is published ({exc.message})",
                         hint="check the connection to the package index", action=Action.CHECK_NETWORK) from None
    body = served.data.decode("utf-8", errors="replace")
    for url, digest in index_files(body, served.content_type, served.url):
        if url.split("#", 1)[0].rsplit("/", 1)[-1] == filename:
            if digest != sha256:
                raise BuildError(f"{page} lists {filename} with sha256 {digest or 'unknown'}, but the file pip "
                                 f"downloaded has {sha256}", hint="the mirror pip used serves another file than "
                                 "the index: use one that matches", action=Action.FIX_INPUT)
            return url.split("#", 1)[0]
    raise BuildError(f"{page} does not list {filename}", hint="the wheel pip downloaded is not on the package index "
                     "(a local copy?); set ACCELSTACK_INDEX_URL to the index it comes from", action=Action.FIX_INPUT)


def index_files(body: str, content_type: str, page: str) -> List[Tuple[str, str]]:
    """(absolute URL, sha256) of every file a simple-API page served from ``page`` lists."""
    if "json" in content_type:
        try:
            doc = json.loads(body)
            return [(urljoin(page, str(f["url"])), str(f.get("hashes", {}).get("sha256", "")))
                    for f in doc.get("files", []) if isinstance(f, dict) and "url" in f]
        except (ValueError, KeyError, TypeError, AttributeError):
            return []
    out = []
    for href in re.findall(r'href="([^"]+)"', body):
        href = href.replace("&amp;", "&")
        digest = re.search(r"#sha256=([0-9a-f]{64})", href)
        out.append((urljoin(page, href), digest.group(1) if digest else ""))
    return out
