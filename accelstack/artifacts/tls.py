"""TLS for the transport: verified against the operating system's trust store (``truststore``, as
pip does), in the transport's own sessions only.

A company's TLS-inspecting proxy whose root the IT department installed on the machine is trusted,
which certifi's fixed bundle cannot know. Nothing is injected into ``ssl`` or ``requests``
globally, so an embedding app's own HTTP clients are untouched. Where truststore is not available
(Python 3.9, or not installed) requests verifies against certifi's bundle.
"""
from __future__ import annotations

import logging
import ssl
import threading
from typing import Any, List, Optional

from requests.adapters import HTTPAdapter

from .streams import describe_error

try:  # an optional dependency (Python 3.10+)
    import truststore
except Exception as exc:  # ImportError on 3.9; any failure means certifi's bundle
    truststore = None  # type: ignore[assignment]
    _UNAVAILABLE = describe_error(exc)
else:
    _UNAVAILABLE = ""

__all__ = ["TrustStoreAdapter", "tls_adapter", "trust_store_context"]

log = logging.getLogger(__name__)

_TLS_LOCK = threading.Lock()
_TLS_CONTEXT: List[Any] = []  # [the process's one truststore context], or [None] where there is none


def trust_store_context() -> Optional[Any]:
    """The process's one SSL context that verifies against the operating system's trust store, or
    ``None`` where truststore is not available (requests then uses certifi's bundle)."""
    with _TLS_LOCK:
        if not _TLS_CONTEXT:
            context: Optional[Any] = None
            why = _UNAVAILABLE
            if truststore is not None:
                try:
                    context = truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                except Exception as exc:  # any failure falls back to certifi
                    why = describe_error(exc)
            if context is None:
                log.info("TLS: the system trust store is not available (%s); verifying against certifi's bundle",
                         why)
            _TLS_CONTEXT.append(context)
        return _TLS_CONTEXT[0]


class TrustStoreAdapter(HTTPAdapter):
    """A requests adapter for https:// whose connections (and proxy tunnels) use ``context``."""

    def __init__(self, context: Any, **kwargs: Any) -> None:
        self._context = context  # set before HTTPAdapter.__init__, which makes the pool manager
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["ssl_context"] = self._context
        return super().init_poolmanager(*args, **kwargs)

    def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["ssl_context"] = self._context
        return super().proxy_manager_for(*args, **kwargs)

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        super().cert_verify(conn, url, verify, cert)
        if verify is True:
            # requests would add certifi's bundle to every connection; the system store is the
            # trust (a bundle named by REQUESTS_CA_BUNDLE still is added, as the user asked)
            conn.ca_certs = None
            conn.ca_cert_dir = None


def tls_adapter() -> Optional[HTTPAdapter]:
    """A :class:`TrustStoreAdapter` for a session's https:// URLs, or ``None`` without truststore.
    Proxies from the environment still apply: requests asks the adapter for a proxy manager, which
    gets the same context."""
    context = trust_store_context()
    if context is None:
        return None
    return TrustStoreAdapter(context)
