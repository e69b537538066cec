"""The service's security and its read-only API, against the real `accelstack serve` on 127.0.0.1."""
from __future__ import annotations

import http.client
import json
import stat
import subprocess
import sys

import pytest
import requests

from accelstack.service.errors import BadRequest
from accelstack.service.job_options import Options

from cli_helpers import check_schema
from service_helpers import REPO, Service, service_env

API = "/api/v1"


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    s = Service(root / "home", root / "cache", "--cors-origin", "http://localhost:5173")
    yield s
    assert s.stop() == 0
    assert not s.token_file.exists(), "the token dies with the process: its file is removed"


def raw(svc: Service, method: str, path: str, headers: dict, body: bytes = b"") -> http.client.HTTPResponse:
    """A request exactly as written (http.client adds no Host or Origin of its own with skip_host)."""
    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.endheaders(body or None)
    return conn.getresponse()


def test_start_announces_the_url_and_a_user_only_token_file(svc):
    assert svc.announced["event"] == "ready" and svc.announced["command"] == "serve"  # a JSON Lines event line
    check_schema("line", svc.announced, "serve's ready line")
    assert svc.announced["page_url"].startswith(svc.announced["url"])
    assert svc.url.startswith("http://127.0.0.1:")
    assert svc.token_file.is_relative_to(svc.home / "state")
    assert stat.S_IMODE(svc.token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(svc.token_file.parent.stat().st_mode) == 0o700
    assert len(svc.token) >= 40
    page = svc.get("/", auth=False)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    assert "http" not in page.text.split("<script>")[1], "the page loads nothing from elsewhere"
    for r in (page, svc.get(f"{API}/jobs")):
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
        assert r.headers["cache-control"] == "no-store" and r.headers["referrer-policy"] == "no-referrer"


SECURITY_HEADERS = {"x-content-type-options": "nosniff", "x-frame-options": "DENY", "referrer-policy": "no-referrer"}


def test_every_response_carries_the_security_headers(svc):
    """docs/serve.md promises them on every response: the guard's own answers (refusals, a
    preflight, the icon) used to carry only nosniff and cache-control."""
    url = svc.url + API + "/jobs"
    answers = {
        "401": requests.get(url, timeout=30),
        "403 host": requests.get(url, headers={**svc.headers(), "Host": "evil.example"}, timeout=30),
        "403 origin": requests.get(url, headers={**svc.headers(), "Origin": "http://evil.example"}, timeout=30),
        "413": requests.post(url, data=b"x" * 70_000, headers=svc.headers(), timeout=30),
        "preflight": requests.options(url, headers={"Origin": "http://localhost:5173", "Access-Control-Request-Method":
                                                    "POST"}, timeout=30),
        "favicon": requests.get(svc.url + "/favicon.ico", timeout=30),
        "404": svc.get(f"{API}/nothing"),
    }
    for what, r in answers.items():
        got = {k: r.headers.get(k) for k in SECURITY_HEADERS}
        assert got == SECURITY_HEADERS, (what, r.status_code, got)


@pytest.mark.parametrize("method,path", [("GET", "/hardware"), ("GET", "/plans"), ("GET", "/status"), ("GET", "/jobs"),
                                         ("POST", "/jobs"), ("GET", "/openapi.json"), ("DELETE", "/jobs/0123456789abcdef")])
def test_every_api_request_needs_the_token(svc, method, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {svc.token}"}):
        r = requests.request(method, svc.url + API + path, headers=headers, json={"kind": "verify"}, timeout=30)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "unauthorized"
    assert svc.get(f"{API}/jobs").status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1:1", "", "localhost.evil.example:{port}"])
def test_a_host_that_is_not_this_service_is_refused_even_with_the_token(svc, host):
    """DNS rebinding: a page's own host name resolved to 127.0.0.1 arrives with that name in Host."""
    headers = {"Authorization": f"Bearer {svc.token}"}
    if host:
        headers["Host"] = host.format(port=svc.port)
    for path in ("/", f"{API}/hardware"):
        r = raw(svc, "GET", path, headers)
        if not host:  # HTTP/1.1 without Host: the protocol layer refuses it first
            assert r.status in (400, 403)
            continue
        assert r.status == 403
        assert json.loads(r.read())["error"]["code"] == "bad-host"
    ok = raw(svc, "GET", f"{API}/jobs", {**headers, "Host": f"localhost:{svc.port}"})
    assert ok.status == 200


def test_a_forged_origin_is_refused_and_cors_answers_only_configured_origins(svc):
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{svc.port + 1}", f"https://127.0.0.1:{svc.port}"):
        r = svc.get(f"{API}/hardware", headers={"Origin": origin})
        assert r.status_code == 403 and r.json()["error"]["code"] == "bad-origin", origin
        assert "access-control-allow-origin" not in r.headers
    same = svc.get(f"{API}/jobs", headers={"Origin": svc.url})
    assert same.status_code == 200 and "access-control-allow-origin" not in same.headers
    # the configured origin: a preflight without the token, then the call with it
    pre = requests.options(svc.url + API + "/jobs", headers={"Origin": "http://localhost:5173",
                                                              "Access-Control-Request-Method": "POST",
                                                              "Access-Control-Request-Headers": "authorization,content-type"},
                           timeout=30)
    assert pre.status_code == 204
    assert pre.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "Authorization" in pre.headers["access-control-allow-headers"]
    r = svc.get(f"{API}/jobs", headers={"Origin": "http://localhost:5173"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:5173"
    bad = requests.options(svc.url + API + "/jobs", headers={"Origin": "http://evil.example"}, timeout=30)
    assert bad.status_code == 403


def test_an_oversized_body_is_refused(svc):
    big = json.dumps({"kind": "generate", "options": {"prompt": "x" * 70_000}}).encode()
    r = requests.post(svc.url + API + "/jobs", data=big, headers=svc.headers(), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload-too-large"

    def chunks():  # no Content-Length: counted while it arrives
        for _ in range(40):
            yield b"x" * 4096

    r = requests.post(svc.url + API + "/jobs", data=chunks(), headers=svc.headers(), timeout=30)
    assert r.status_code == 413


@pytest.mark.parametrize("body,code", [
    (b"not json", "bad-request"),
    (b"[]", "bad-request"),
    (b'{"kind": "format-disk"}', "bad-request"),
    (b'{"kind": "verify", "options": {"output": "/etc/passwd"}}', "bad-request"),
    (b'{"kind": "install", "options": {"force": "yes"}}', "bad-request"),
    (b'{"kind": "install", "options": {"backend": "../../x"}}', "bad-request"),
    (b'{"kind": "verify", "extra": 1}', "bad-request"),
    (b'{"kind": "generate", "options": {"model": "../../etc/passwd", "prompt": "a cat"}}', "no-models"),
    (b'{"kind": "verify", "options": ' + b'[' * 40 + b']' * 40 + b'}', "bad-request"),
    # what Python reads but JSON does not hold: once queued, the job list could not be written back
    (b'{"kind": "generate", "options": {"model": "m", "prompt": "x", "cfg_scale": NaN}}', "bad-request"),
    (b'{"kind": "generate", "options": {"model": "m", "prompt": "x", "cfg_scale": -Infinity}}', "bad-request"),
    (b'{"kind": "generate", "options": {"model": "m", "prompt": "x", "cfg_scale": 1e999}}', "bad-request"),
    (b'{"kind": "generate", "options": {"model": "m", "prompt": "\\ud800"}}', "bad-request"),
    (b'{"kind": "generate", "options": {"model": "m", "prompt": "x", "\\udfff": 1}}', "bad-request"),
    # the last of two keys would win here, where a proxy may have checked the first
    (b'{"kind": "verify", "kind": "install"}', "bad-request"),
    (b'{"kind": "verify", "options": {"families": ["sd1"], "families": ["flux"]}}', "bad-request"),
    (b"", "bad-request"),
    (b"  ", "bad-request"),
])
def test_malformed_jobs_are_refused_before_anything_runs(svc, body, code):
    r = requests.post(svc.url + API + "/jobs", data=body, headers=svc.headers(), timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code
    assert "more than" not in r.json()["error"]["message"], "an empty body is not too large"
    assert svc.get(f"{API}/jobs").json()["jobs"] == []


@pytest.mark.parametrize("path", ["/jobs/..%2F..%2Fetc%2Fpasswd/image", "/jobs/0123456789abcdef", "/jobs/ZZZ/events",
                                  "/jobs/0123456789abcdef/image", "/nothing", "/../../etc/passwd"])
def test_unknown_jobs_and_paths_are_404_and_never_files(svc, path):
    r = svc.get(API + path)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not-found"


def test_hardware_plans_and_status(svc):
    hw = svc.get(f"{API}/hardware").json()
    assert hw["report"]["os"]["name"] and hw["report"]["preference"]
    again = svc.get(f"{API}/hardware").json()
    assert again["detected_at"] == hw["detected_at"], "the report is cached"
    assert svc.get(f"{API}/hardware", params={"refresh": "1"}).json()["report"]["os"] == hw["report"]["os"]
    plans = svc.get(f"{API}/plans").json()["plans"]
    assert set(plans) == {"ggml", "torch"}
    assert plans["ggml"]["plan"]["stack"] == "ggml" and plans["ggml"]["plan"]["backend"]
    assert plans["torch"]["plan"] is not None or plans["torch"]["error"]["message"]
    status = svc.get(f"{API}/status").json()
    assert status["home"] == str(svc.home)
    assert {s["stack"] for s in status["stacks"]} == {"ggml", "torch"}
    assert not any(s["active"] for s in status["stacks"])
    spec = svc.get(f"{API}/openapi.json").json()
    assert spec["openapi"].startswith("3.")


def test_the_openapi_description_names_every_route():
    from accelstack.service.app import API as PREFIX
    from accelstack.service.app import Hardware, build_app, resource_bytes
    from accelstack.service.jobs import Jobs
    from accelstack.settings import Settings

    s = Settings.resolve()
    hardware = Hardware(lambda: None)
    app = build_app(s, hardware, Jobs(s, lambda: None))
    routes = {(r.path, m.lower()) for r in app.routes for m in r.methods if m != "HEAD"}  # type: ignore[attr-defined]
    spec = json.loads(resource_bytes("openapi.json"))
    described = {(p if p == "/" else p, m) for p, ops in spec["paths"].items() for m in ops if m in ("get", "post", "delete")}
    assert routes == described
    assert all(p == "/" or p.startswith(PREFIX) for p, _ in routes)
    docs = (REPO / "docs" / "serve.md").read_text()
    for path, _ in routes:
        assert path in docs, f"docs/serve.md does not describe {path}"


def test_listening_beyond_loopback_needs_allow_remote(tmp_path):
    env = service_env(tmp_path / "home", tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-m", "accelstack", "serve", "--json", "--host", "0.0.0.0"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 2
    err = json.loads(proc.stdout.strip().splitlines()[-1])
    assert err["error"] == "RemoteBindRefused" and "0.0.0.0" in err["message"]


@pytest.mark.parametrize("origin", ["null", "*", "http://*", "localhost:3000", "file://", "ftp://x.example",
                                    "http://localhost:3000/app", "http://user@localhost:3000", "http://localhost:3000?x",
                                    "http://localhost:x", "http://", ""])
def test_a_cors_origin_that_is_not_an_origin_is_refused_before_the_service_starts(tmp_path, origin):
    """``null`` is what sandboxed frames, file:// pages and data: URLs send: allowing it opens the
    API to any of them. ``*`` and the rest would never match, and say so too late."""
    env = service_env(tmp_path / "home", tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-m", "accelstack", "serve", "--json", "--cors-origin", origin], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    assert proc.returncode == 2, proc.stdout[-2000:]
    err = json.loads(proc.stdout.strip().splitlines()[-1])
    assert err["error"] == "UsageError" and "--cors-origin" in err["message"], err
    assert "http://localhost:5173" in err["hint"], err


def test_allow_remote_trusts_the_token_alone(tmp_path):
    """With --allow-remote the service is reached under names it cannot know: Host is not checked,
    the token still is (and a foreign Origin is still refused)."""
    svc = Service(tmp_path / "home", tmp_path / "cache", "--allow-remote")
    try:
        other = {"Host": f"my-machine.lan:{svc.port}"}
        assert raw(svc, "GET", f"{API}/jobs", {**other, "Authorization": f"Bearer {svc.token}"}).status == 200
        assert raw(svc, "GET", f"{API}/jobs", other).status == 401
        assert raw(svc, "GET", f"{API}/jobs", {**other, "Authorization": f"Bearer {svc.token}",
                                                "Origin": "http://evil.example"}).status == 403
    finally:
        assert svc.stop() == 0


def test_the_service_stops_when_its_parent_ends(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    svc = Service(tmp_path / "home", tmp_path / "cache", "--parent-pid", str(parent.pid))
    try:
        assert svc.get(f"{API}/jobs").status_code == 200
        parent.kill()
        parent.wait()
        assert svc.proc.wait(60) == 0
        assert f"parent process {parent.pid} ended" in svc.stderr()
        assert not svc.token_file.exists()
    finally:
        svc.stop()
        if parent.poll() is None:
            parent.kill()


def test_a_parent_that_is_not_running_is_an_error(tmp_path):
    env = service_env(tmp_path / "home", tmp_path / "cache")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    proc = subprocess.run([sys.executable, "-m", "accelstack", "serve", "--parent-pid", str(gone.pid)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 2 and "is not running" in proc.stderr


def test_an_integer_too_large_for_a_float_option_is_a_400():
    """``float()`` of a 400-digit integer raises OverflowError: it was a 500 "bug in accelstack"."""
    options = Options("generate", {"cfg_scale": 10 ** 400, "strength": -(2 ** 60), "control_strength": 2 ** 53})
    for name in ("cfg_scale", "strength"):
        with pytest.raises(BadRequest, match=f"option '{name}' of a generate job must be a number"):
            options.typed(name, float)
    assert options.typed("control_strength", float) == 2.0 ** 53


def test_serve_docs_name_every_option_of_a_generate_job():
    """The service takes every field of the core's GenerateRequest but the engine's wire-only ones:
    docs/serve.md's table named 12 of 24 (the components, images and strengths were missing)."""
    import dataclasses

    from accelstack import core
    from accelstack.service.jobs import WIRE_ONLY

    row = next(line for line in (REPO / "docs" / "serve.md").read_text().splitlines() if line.startswith("| `generate`"))
    names = [f.name for f in dataclasses.fields(core.GenerateRequest) if f.name not in WIRE_ONLY] + ["model", "stack"]
    assert [n for n in names if f"`{n}`" not in row] == []
