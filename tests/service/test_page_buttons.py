"""Issue 42, the status page in a real headless Chromium: a button does what it says (Reinstall on a
healthy runtime reinstalls it: a forced install, verified again), and an install that changed
nothing says "already installed", never a verdict it did not reach."""
from __future__ import annotations

from selenium.webdriver.support.ui import WebDriverWait
from test_page import browser, pytestmark  # noqa: F401 - the same headless Chromium, skipped the same way

FINAL = ("succeeded", "failed", "cancelled", "refused", "lost")


def _text(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def _open(driver, svc) -> None:
    driver.get(f"{svc.url}/#token={svc.token}")
    WebDriverWait(driver, 60).until(lambda d: "healthy" in _text(d, "runtime") and not d.find_element("id", "btn-install").get_attribute("disabled"))


def _last_final(driver) -> dict:
    return driver.execute_script("const f = window.accelstack.finals; return f[f.length - 1]")


def test_reinstall_on_a_healthy_runtime_reinstalls_it_and_verifies_again(browser, start_service, installed_home):  # noqa: F811
    svc = start_service(home=installed_home / "home", cache=installed_home / "cache")
    _open(browser, svc)
    button = browser.find_element("id", "btn-install")
    assert button.text == "Reinstall"
    button.click()
    WebDriverWait(browser, 300).until(lambda d: _text(d, "job-state") in FINAL)
    assert _text(browser, "job-state") == "succeeded", _text(browser, "log")
    result = _last_final(browser)["data"]["result"]
    assert result["changed"] and result["reinstalled"], result  # it did reinstall, not "nothing to do"
    assert _text(browser, "verdict") == "PASS"  # the new copy's own check
    jobs = svc.get("/api/v1/jobs").json()["jobs"]
    assert jobs[-1]["kind"] == "install" and jobs[-1]["options"].get("force") is True


def test_an_install_that_changed_nothing_says_already_installed_never_a_verdict(browser, start_service, installed_home):  # noqa: F811
    svc = start_service(home=installed_home / "home", cache=installed_home / "cache")
    _open(browser, svc)
    browser.execute_script("start('install')")  # an install without force, as an app may ask for one
    WebDriverWait(browser, 120).until(lambda d: _text(d, "job-state") in FINAL)
    assert _last_final(browser)["data"]["result"]["changed"] is False
    assert _text(browser, "verdict") == "already installed"
    assert "PASS" not in _text(browser, "verdict") and "PASS" not in _text(browser, "result-detail")
    assert "nothing changed" in _text(browser, "job-step") or "already installed" in _text(browser, "job-step")


def test_the_accelerator_panel_says_the_local_build_is_installed_once_it_is(browser, start_service, installed_home):  # noqa: F811
    svc = start_service(home=installed_home / "home", cache=installed_home / "cache")
    _open(browser, svc)
    WebDriverWait(browser, 30).until(lambda d: "ggml:" in _text(d, "accelerator"))
    panel = _text(browser, "accelerator")
    assert "is needed" not in panel, panel  # the plan's "a local CPU build is needed" is done: it is installed
    ggml = browser.find_element("css selector", '#accelerator [data-stack="ggml"]').text
    assert "installed" in ggml and "cpu" in ggml.lower(), ggml


def test_reloading_the_page_keeps_the_job_history(browser, start_service, installed_home):  # noqa: F811
    svc = start_service(home=installed_home / "home", cache=installed_home / "cache")
    first = svc.start_job("install")  # an app's job, before the page was opened: nothing to do on the active runtime
    assert svc.follow(first["id"])[1] == "result"
    _open(browser, svc)
    browser.execute_script("start('install')")
    WebDriverWait(browser, 120).until(lambda d: _text(d, "job-state") in FINAL)
    browser.refresh()
    _open(browser, svc)
    WebDriverWait(browser, 30).until(lambda d: len(d.find_elements("css selector", "#history li")) >= 2)
    items = [li.text for li in browser.find_elements("css selector", "#history li")]
    assert all("install" in t and "succeeded" in t and "already installed" in t for t in items[:2]), items


def test_a_family_verify_is_shown_beside_the_runtimes_own_verified_time(browser, start_service, installed_home):  # noqa: F811
    svc = start_service(home=installed_home / "home", cache=installed_home / "cache")
    job = svc.start_job("verify", families=["flux"])
    _progress, event, data = svc.follow(job["id"])
    assert event == "result" and data["result"]["ok"], data
    _open(browser, svc)
    line = browser.find_element("css selector", '#runtime [data-stack="ggml"]').text
    assert "verified" in line and "flux" in line and "families" in line, line  # the family check, with its time
