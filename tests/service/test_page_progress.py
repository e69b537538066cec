"""Issue 25, the status page in a real headless Chromium: it never looks frozen while a job runs
(screenshots every second during an install from a slow local channel, one that stalls mid-way,
change at least every 2 s), says what the job is doing, how long it has run and how long is
left, cancels from its button, fits its buttons to the runtime's state, and, opened without its
token, says so with its controls off; the browser's own favicon request is no 401. A verify
started from the page behind a running job says queued, then running, then its outcome, and its
screenshots change at least every 2 s too; a failed job shows its error and its hint."""
from __future__ import annotations

import functools
import hashlib
import http.server
import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import requests
from test_page import browser, pytestmark  # noqa: F401 - the same headless Chromium, skipped the same way

from accelstack.manifests.keys import generate_keypair
from accelstack.publisher.build_cache import BuildResult
from accelstack.publisher.publish import build_manifest, write_signed_manifest
from accelstack.serde import to_dict

from service_helpers import REPO

SCREENSHOT = REPO / ".cache" / "service-job-screenshot.png"

CHUNK = 64 * 1024
CHUNK_DELAY = 0.03  # ~2 MiB/s: the download takes a few seconds, with a time left to show
STALL = 4.0  # seconds without a byte, half-way through: no event comes, the page must still move
FINAL = ("succeeded", "failed", "cancelled", "refused", "lost")


class _SlowHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def copyfile(self, source, outputfile) -> None:
        sent, half = 0, self.server.stall_at.get(Path(source.name).name)  # type: ignore[attr-defined]
        while True:
            chunk = source.read(CHUNK)
            if not chunk:
                return
            outputfile.write(chunk)
            outputfile.flush()
            sent += len(chunk)
            if half is not None and sent >= half:
                half = None
                time.sleep(STALL)
            time.sleep(CHUNK_DELAY)


@pytest.fixture
def slow_channel(tmp_path, ggml_cpu_build):
    """The cached CPU build published as a signed channel on 127.0.0.1, its wheel served slowly."""
    root = tmp_path / "site"
    (root / "v1").mkdir(parents=True)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_SlowHandler, directory=str(root)))
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    private_pem, public_b64 = generate_keypair()
    wheel = Path(ggml_cpu_build.wheel)
    d = root / "v1"
    shutil.copyfile(wheel, d / wheel.name)
    data = wheel.read_bytes()
    rec = BuildResult(**{**to_dict(ggml_cpu_build), "wheel": str(d / wheel.name),
                         "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    (d / f"{wheel.name}.build.json").write_text(json.dumps(to_dict(rec)))
    write_signed_manifest(d, build_manifest(d, f"{url}/v1", source="test-channel", version=1), private_pem)
    httpd.stall_at = {wheel.name: len(data) // 2}  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield {"manifest": f"{url}/v1/ggml-manifest.json", "key": public_b64}
    httpd.shutdown()
    httpd.server_close()


def _text(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def _watch(driver, until_final: bool = True, limit: float = 180.0, act=None):
    """A screenshot every second (and what the job panel said then) until the job ends; ``act(shots)``
    after each one, for a test that changes something part-way."""
    shots = []
    start = next_at = time.monotonic()
    while time.monotonic() - start < limit:
        png = driver.get_screenshot_as_png()
        # the badge and the event count in one script: read apart, an event can land between them
        state, events = driver.execute_script(
            "return [document.getElementById('job-state').innerText, window.accelstack.events]")
        shots.append({"t": round(time.monotonic() - start, 2), "png": hashlib.sha256(png).hexdigest(), "bytes": png,
                      "state": state.strip(), "step": _text(driver, "job-step"),
                      "elapsed": _text(driver, "elapsed"), "eta": _text(driver, "eta"), "spinner": _text(driver, "spinner"),
                      "events": events})
        if shots[-1]["state"] in FINAL:
            return shots
        if act is not None:
            act(shots)
        next_at += 1.0
        time.sleep(max(0.0, next_at - time.monotonic()))  # sampling once a second, not waiting for something
    raise AssertionError(f"the job did not end in {limit:.0f} s: {shots[-1]}")


def _never_frozen(shots) -> None:
    """No two screenshots 2 s or more apart (two samples, or a late one) are the same picture."""
    for i, a in enumerate(shots):
        for j in range(i + 1, len(shots)):
            b = shots[j]
            if (j - i >= 2 or b["t"] - a["t"] > 2.0) and a["png"] == b["png"]:
                raise AssertionError(f"the page looked the same at {a['t']} s and {b['t']} s: "
                                     f"{dict(b, bytes=len(b['bytes']))}")


def test_the_page_moves_while_a_job_runs_and_cancels_it(browser, start_service, slow_channel, probe_model, tmp_path):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    svc = start_service("--no-build", "--manifest", slow_channel["manifest"], "--trusted-key", slow_channel["key"])
    browser.get(f"{svc.url}/#token={svc.token}")
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: _text(d, "conn") == "connected" and "not installed" in _text(d, "runtime"))
    # nothing installed: Install leads, Repair and Verify are off and say why
    install, repair, verify = (browser.find_element("id", f"btn-{k}") for k in ("install", "repair", "verify"))
    wait.until(lambda d: install.is_enabled())
    assert "secondary" not in install.get_attribute("class")
    assert not repair.is_enabled() and not verify.is_enabled()
    assert "install" in verify.get_attribute("title") and "nothing is installed" in _text(browser, "btn-reason")

    install.click()
    shots = _watch(browser)
    assert shots[-1]["state"] == "succeeded", (shots[-1], _text(browser, "job-error"), svc.stderr())
    assert len(shots) >= 6, shots  # the slow channel makes it long enough to watch
    # never frozen: no three screenshots in a row (2 s) are the same, stall or not
    for a, b, c in zip(shots, shots[1:], shots[2:]):
        assert not (a["png"] == b["png"] == c["png"]), \
            f"the page did not change from {a['t']} s to {c['t']} s: {dict(b, bytes=len(b['bytes']))}"
    _never_frozen(shots)
    # the badge follows the job: "running" from its first event on (before it, the reply's "queued"
    # at most), and the outcome at the end
    live = [s for s in shots if s["state"] not in FINAL]
    assert all(s["state"] in ("starting", "queued", "running") for s in live), [s["state"] for s in live]
    assert all(s["state"] == "running" for s in live if s["events"]), [(s["state"], s["events"]) for s in live]
    running = [s for s in shots if s["state"] == "running"]
    assert any(s["step"].startswith("downloading") for s in running), [s["step"] for s in running]
    assert any(re.search(r"about .+ left", s["eta"]) for s in running), "a download has a time left"
    assert any(s["spinner"] for s in running), "steps without an estimate have a spinner"
    assert len({s["elapsed"] for s in running}) == len(running) and all(s["elapsed"].startswith("elapsed ") for s in running)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)  # the page mid-job, for people to look at
    SCREENSHOT.write_bytes(running[len(running) // 2]["bytes"])
    steps = browser.execute_script("return window.accelstack.steps")
    assert any(s.startswith("verifying") for s in steps) and any(s.startswith("generating") for s in steps), steps
    assert _text(browser, "job-step").startswith("done in")
    # the probe image, and why it is noise
    wait.until(lambda d: "Noise by design" in _text(d, "result-note"))
    # a healthy runtime: Verify leads, Install is a secondary Reinstall; times are local, not ISO
    wait.until(lambda d: "healthy" in _text(d, "runtime") and verify.is_enabled())
    assert "secondary" not in verify.get_attribute("class") and "secondary" in install.get_attribute("class")
    assert install.text == "Reinstall"
    assert "verified" in _text(browser, "runtime") and not re.search(r"\d{4}-\d\d-\d\dT\d\d:", _text(browser, "runtime"))

    # Cancel: a verify, stopped from its button
    cancel = browser.find_element("id", "btn-cancel")
    assert not cancel.is_enabled()
    before = browser.execute_script("return window.accelstack.events")
    verify.click()
    wait.until(lambda d: cancel.is_enabled() and d.execute_script("return window.accelstack.events") > before)
    cancel.click()
    wait.until(lambda d: _text(d, "job-state") in FINAL)
    assert _text(browser, "job-state") == "cancelled", _text(browser, "job-error")
    assert "cancelled" in _text(browser, "job-error") and "start the job again" in _text(browser, "job-hint")
    assert not cancel.is_enabled() and verify.is_enabled()
    log = svc.stderr()
    assert re.search(r"install succeeded in .+: PASS", log) or '"state":"succeeded"' in log, log
    assert '"state":"cancelled"' in log, log

    # a page opened while jobs are queued or running (another tab, an app) follows the latest, and cancels it
    first = svc.start_job("verify")
    second = svc.start_job("verify")  # queued behind the first: one job runs at a time
    browser.refresh()
    wait.until(lambda d: f"verify job {second['id']}" in _text(d, "job-title") and d.find_element("id", "btn-cancel").is_enabled())
    browser.find_element("id", "btn-cancel").click()
    wait.until(lambda d: _text(d, "job-state") in FINAL)
    assert _text(browser, "job-state") == "cancelled"
    assert svc.get(f"/api/v1/jobs/{second['id']}").json()["job"]["state"] == "cancelled"
    assert svc.get(f"/api/v1/jobs/{first['id']}").json()["job"]["state"] != "cancelled"

    # the favicon a browser asks for on its own is no 401
    assert requests.get(f"{svc.url}/favicon.ico", timeout=30).status_code == 204
    # a tab opened without the token says so, with every control off
    browser.switch_to.new_window("tab")
    browser.get(f"{svc.url}/")
    wait.until(lambda d: _text(d, "conn") == "no token")
    assert "without its token" in _text(browser, "notice")
    assert all(not b.is_enabled() for b in browser.find_elements("css selector", "button"))
    status = browser.execute_async_script(
        "const done = arguments[0]; fetch('/favicon.ico').then(r => done(r.status), e => done(String(e)))")
    assert status == 204


class _Gate(http.server.BaseHTTPRequestHandler):
    """A channel that answers 404 at once, or, once armed, holds each request until its gate opens
    (then 404): an install that runs for as long as the test wants, then fails."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.server.armed.is_set():  # type: ignore[attr-defined]
            self.server.asked.set()  # type: ignore[attr-defined]
            self.server.gate.wait(240)  # type: ignore[attr-defined]
        self.send_error(404)


@pytest.fixture
def gated_channel():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gate)
    httpd.daemon_threads = True
    httpd.armed, httpd.asked, httpd.gate = threading.Event(), threading.Event(), threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/ggml-manifest.json"  # type: ignore[attr-defined]
    yield httpd
    httpd.gate.set()  # type: ignore[attr-defined]
    httpd.shutdown()
    httpd.server_close()


VERIFY_SCREENSHOT = REPO / ".cache" / "service-verify-screenshot.png"


def test_a_verify_from_the_page_shows_queued_running_and_its_end_and_never_looks_frozen(
        browser, start_service, installed_home, gated_channel):  # noqa: F811
    """A verify started from the page waits behind an install (held by its channel), then runs:
    the badge says queued, then running, then succeeded; a screenshot every second from the click
    to the verdict never shows the same picture 2 s apart. Then a Reinstall from the page fails
    (the channel answers 404) and the page shows the job's error and its hint."""
    from selenium.webdriver.support.ui import WebDriverWait

    gate = gated_channel
    svc = start_service("--no-build", "--manifest", gate.url, home=installed_home / "home", cache=installed_home / "cache")
    browser.get(f"{svc.url}/#token={svc.token}")
    wait = WebDriverWait(browser, 60)
    verify, install = browser.find_element("id", "btn-verify"), browser.find_element("id", "btn-install")
    wait.until(lambda d: _text(d, "conn") == "connected" and "healthy" in _text(d, "runtime") and verify.is_enabled())
    # the page has looked for a job to follow (there was none): the install below is not its job
    wait.until(lambda d: d.execute_script("return performance.getEntriesByType('resource').some("
                                          "e => new URL(e.name).pathname === '/api/v1/jobs' && e.responseEnd > 0)"))
    gate.armed.set()
    ahead = svc.start_job("install")
    assert gate.asked.wait(60), "the install never asked its channel"  # it runs, held by the channel

    verify.click()
    wait.until(lambda d: "verify job" in _text(d, "job-title"))
    mine = next(j for j in svc.get("/api/v1/jobs").json()["jobs"] if j["kind"] == "verify")
    assert f"verify job {mine['id']}" in _text(browser, "job-title")
    assert svc.get(f"/api/v1/jobs/{mine['id']}").json()["job"]["state"] == "queued"  # behind the held install

    def release(shots) -> None:  # a few screenshots of the queued job, then the install ends
        if len(shots) == 3:
            gate.gate.set()

    shots = _watch(browser, limit=240.0, act=release)
    states = [s["state"] for s in shots]
    # the badge follows the job's real state: queued while the install holds it, running from its
    # first event (or the service's word) on, and the outcome at the end
    assert states[:3] == ["queued"] * 3, states
    assert "running" in states, states
    assert all(s["state"] == "running" for s in shots if s["events"] and s["state"] not in FINAL), \
        [(s["state"], s["events"]) for s in shots]
    first_running = states.index("running")
    assert all(st in ("running",) + FINAL for st in states[first_running:]), states
    assert states[-1] == "succeeded", (states, _text(browser, "job-error"))
    assert _text(browser, "verdict") == "PASS" and "badge ok" in browser.find_element("id", "job-state").get_attribute("class")
    assert svc.get(f"/api/v1/jobs/{ahead['id']}").json()["job"]["state"] == "failed"
    # the verify itself, not only its wait, lasted long enough to watch
    running = [s for s in shots if s["state"] == "running"]
    assert len(running) >= 3, states
    # never frozen: any two screenshots 2 s apart differ, waiting or working
    _never_frozen(shots)
    assert all("waiting" in s["step"] for s in shots[:3]), [s["step"] for s in shots[:3]]
    assert all(s["elapsed"].startswith("elapsed ") for s in running), [s["elapsed"] for s in running]
    assert any(s["step"].startswith(("verifying", "generating")) for s in running), [s["step"] for s in running]
    assert _text(browser, "job-step").startswith("done in")
    VERIFY_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)  # the page mid-verify, for people to look at
    VERIFY_SCREENSHOT.write_bytes(running[len(running) // 2]["bytes"])

    # a failed job: the page shows its error and what to do, as the service reported them
    wait.until(lambda d: install.is_enabled() and install.text == "Reinstall")
    install.click()
    wait.until(lambda d: _text(d, "job-state") in FINAL and "install job" in _text(d, "job-title"))
    assert _text(browser, "job-state") == "failed", (_text(browser, "job-error"), svc.stderr())
    assert "badge bad" in browser.find_element("id", "job-state").get_attribute("class")
    failed = next(j for j in svc.get("/api/v1/jobs").json()["jobs"] if j["kind"] == "install" and j["id"] != ahead["id"])
    err = svc.get(f"/api/v1/jobs/{failed['id']}").json()["job"]["error"]
    assert err["message"] and err["hint"], err
    assert _text(browser, "job-error") == err["message"]
    assert _text(browser, "job-hint").startswith(f"what to do: {err['hint']}"), (_text(browser, "job-hint"), err)
    assert "manifest" in _text(browser, "job-error") and "404" in _text(browser, "job-error")
    assert _text(browser, "job-step").startswith("failed after")
    assert browser.find_element("id", "job-error").is_displayed() and browser.find_element("id", "job-hint").is_displayed()
    # nothing was changed: the runtime is still healthy, and Verify leads again
    wait.until(lambda d: "healthy" in _text(d, "runtime") and verify.is_enabled())
