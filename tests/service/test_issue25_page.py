"""Issue 25, the status page in a real headless Chromium: it never looks frozen while a job runs
(screenshots every second during an install from a slow local channel, one that stalls mid-way,
change at least every 2 s), says what the job is doing, how long it has run and how long is
left, cancels from its button, fits its buttons to the runtime's state, and, opened without its
token, says so with its controls off; the browser's own favicon request is no 401."""
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


def _watch(driver, until_final: bool = True, limit: float = 180.0):
    """A screenshot every second (and what the job panel said then) until the job ends."""
    shots = []
    start = next_at = time.monotonic()
    while time.monotonic() - start < limit:
        png = driver.get_screenshot_as_png()
        shots.append({"t": round(time.monotonic() - start, 2), "png": hashlib.sha256(png).hexdigest(), "bytes": png,
                      "state": _text(driver, "job-state"), "step": _text(driver, "job-step"),
                      "elapsed": _text(driver, "elapsed"), "eta": _text(driver, "eta"), "spinner": _text(driver, "spinner")})
        if shots[-1]["state"] in FINAL:
            return shots
        next_at += 1.0
        time.sleep(max(0.0, next_at - time.monotonic()))  # sampling once a second, not waiting for something
    raise AssertionError(f"the job did not end in {limit:.0f} s: {shots[-1]}")


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
    running = [s for s in shots if s["state"] in ("running", "queued")]
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
