"""Issue 46, the status page in a real headless Chromium: the jobs it lists say whether a generate job
reused the service's loaded model or loaded it (and how long that took), as an app's jobs ran."""
from __future__ import annotations

from selenium.webdriver.support.ui import WebDriverWait
from test_page import browser, pytestmark  # noqa: F401 - the same headless Chromium, skipped the same way


def _generate(svc, seed):
    options = {"prompt": "a cube", "model": "probe", "width": 64, "height": 64, "steps": 1, "sampler": "euler", "seed": seed}
    job = svc.start_job("generate", **options)
    _, event, data = svc.follow(job["id"])
    assert event == "result", data["error"].get("message")
    return job["id"], data["result"]


def test_the_page_says_which_generate_job_reused_the_loaded_model(browser, start_service, installed_home,  # noqa: F811
                                                                   probe_model, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "probe").symlink_to(probe_model.path, target_is_directory=True)
    svc = start_service("--models-dir", str(models), home=installed_home / "home", cache=installed_home / "cache")
    (first, r1), (second, r2) = _generate(svc, 1), _generate(svc, 2)
    assert not r1["reused_worker"] and r2["reused_worker"], (r1.get("restarts"), r2.get("restarts"), r2.get("load_seconds"))
    browser.get(f"{svc.url}/#token={svc.token}")
    item = '#history li[data-job="{}"]'
    WebDriverWait(browser, 60).until(lambda d: d.find_elements("css selector", item.format(second)))
    loaded = browser.find_element("css selector", item.format(first)).text
    reused = browser.find_element("css selector", item.format(second)).text
    assert "reused the loaded model" in reused and "probe" in reused, reused
    assert "loaded the model in" in loaded and "reused" not in loaded, loaded
