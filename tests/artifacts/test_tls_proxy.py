"""TLS against the operating system's trust store (truststore, as pip does) and proxies from the
environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY), over real servers on 127.0.0.1."""
from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading

import pytest

from accelstack.artifacts import FetchError, Transport, fetch_one
from accelstack.artifacts.tls import trust_store_context as _trust_store_context

from artifact_helpers import payload, ref_for, start_server


def _certificates(tmp_path):
    """A test CA and a certificate for 127.0.0.1 signed by it: (ca.pem, server cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "accelstack test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(pem))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"


@pytest.fixture
def https_server(tmp_path):
    ca, cert, key = _certificates(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    fs, stop = start_server(tls)
    try:
        yield fs, ca
    finally:
        stop()


@pytest.fixture
def no_extra_bundles(monkeypatch):
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_https_is_verified_against_the_system_trust_store(https_server, cache, retry, monkeypatch,
                                                           no_extra_bundles):
    """On Linux the system store is OpenSSL's default locations, which SSL_CERT_FILE moves: a CA
    installed there (as an IT department installs its TLS-inspecting proxy's root) is trusted;
    certifi's fixed bundle would never trust it."""
    if _trust_store_context() is None:
        pytest.skip("truststore is not installed (Python 3.9): TLS is verified against certifi's bundle")
    server, ca = https_server
    data = payload(50_000)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    with Transport(connect_timeout=5, read_timeout=5) as transport:
        with pytest.raises(FetchError, match="certificate is not trusted") as caught:  # our CA is in no store yet
            fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry)
        assert "trust store" in caught.value.hint
        assert len(server.hits("/a.bin")) == 0  # refused at the handshake, before any request
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    with Transport(connect_timeout=5, read_timeout=5) as transport:
        assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
        adapter = transport._session().get_adapter(ref.urls[0])
        assert type(adapter).__name__ == "TrustStoreAdapter"
    import truststore

    assert isinstance(_trust_store_context(), truststore.SSLContext)
    # only our session: nothing was injected into the ssl module for everyone else
    assert ssl.SSLContext is not truststore.SSLContext


def test_no_proxy_sends_loopback_past_a_bogus_proxy(server, cache, transport, retry, monkeypatch):
    for name in ("no_proxy", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    data = payload(40_000)
    ref = ref_for("a.bin", data, server.serve("/a.bin", data))
    assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
    assert [h.target for h in server.hits("/a.bin")] == ["/a.bin"]  # asked directly, not as a proxy


def test_a_proxy_from_the_environment_carries_requests_to_other_hosts(server, cache, transport, retry, monkeypatch):
    proxy, stop = start_server()
    try:
        data = payload(40_000, seed=3)
        origin_url = server.serve("/a.bin", data).replace("127.0.0.1", "localhost")
        proxy.serve("/a.bin", data)  # the "proxy" answers for the origin, recording what it was asked
        for name in ("no_proxy", "http_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.base)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # localhost is not excluded
        ref = ref_for("a.bin", data, origin_url)
        assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
        assert [h.target for h in proxy.hits("/a.bin")] == [origin_url]  # the absolute URI: a proxy request
        assert server.hits("/a.bin") == []
    finally:
        stop()


class _ConnectProxy:
    """A tiny HTTP CONNECT proxy on 127.0.0.1 that records each request line and tunnels bytes."""

    def __init__(self) -> None:
        self.requests = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = client.recv(4096)
            if not data:
                client.close()
                return
            head += data
        line = head.split(b"\r\n", 1)[0].decode()
        self.requests.append(line)
        method, target, _ = line.split(" ", 2)
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pipe(src, dst) -> None:
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)

    def close(self) -> None:
        self.sock.close()


def test_https_through_an_https_proxy_tunnel_keeps_the_system_trust_store(https_server, cache, retry, monkeypatch,
                                                                           no_extra_bundles):
    if _trust_store_context() is None:
        pytest.skip("truststore is not installed (Python 3.9)")
    server, ca = https_server
    proxy = _ConnectProxy()
    try:
        data = payload(60_000, seed=7)
        url = server.serve("/a.bin", data).replace("127.0.0.1", "localhost")
        for name in ("no_proxy", "http_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # the CA only the system store knows
        ref = ref_for("a.bin", data, url)
        with Transport(connect_timeout=5, read_timeout=5) as transport:
            assert fetch_one(ref, cache=cache, offline=False, transport=transport, retry=retry).read_bytes() == data
            managers = transport._session().get_adapter(url).proxy_manager.values()
            assert [m.connection_pool_kw.get("ssl_context") for m in managers] == [_trust_store_context()]
        port = url.split(":")[2].split("/")[0]
        assert [r.rsplit(" ", 1)[0] for r in proxy.requests] == [f"CONNECT localhost:{port}"]
    finally:
        proxy.close()
