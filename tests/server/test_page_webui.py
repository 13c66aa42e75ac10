"""The page's everyday habits of WebUI users (issue 44), in the headless browser: Generate in sight at 1280x900
and Ctrl+Enter, a batch count, the model picker over a server of two models, PNG info by dropping a PNG on the
form, deleting results and clearing cancelled ones, the warning for a size far from the model's trained one."""

from __future__ import annotations

import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select
from test_page import _until, _wait, chromium
from test_server import call

FIRST, SECOND = "anima-tiny-random", "anima-second"  # conftest's `two` serves both; the second records 64x64


@pytest.fixture(scope="module")
def page(two):
    url, queue = two
    with chromium() as driver:
        driver.set_window_size(1280, 900)
        driver.get(f"{url}/")
        _until(driver, lambda d: len(Select(d.find_element(By.ID, "model-pick")).options) == 2, "the models")
        _until(driver, lambda d: d.find_element(By.ID, "steps").get_attribute("value") == "20", "the defaults")
        yield driver, url, queue


def _jobs(url: str) -> list[dict]:
    return call(f"{url}/api/jobs?limit=200")[1]


def _set(driver, **fields) -> None:
    for name, value in fields.items():
        field = driver.find_element(By.ID, name)
        field.clear()
        field.send_keys(str(value))


def _new_jobs(url: str, before: set[str], count: int) -> list[dict]:
    deadline = time.monotonic() + 60
    while len(new := [job for job in _jobs(url) if job["id"] not in before]) < count:
        assert time.monotonic() < deadline, f"{count} new jobs were not submitted"
        time.sleep(0.1)
    return [_wait(url, job) for job in sorted(new, key=lambda job: job["created"])]


def test_generate_is_in_sight_at_1280x900(page, tmp_path):
    driver, _, _ = page
    # A 1280x900 window: its page area is smaller still (757 px high here, the browser's own bars take the rest).
    assert driver.execute_script("return innerWidth") >= 1200 and driver.execute_script("return innerHeight") >= 700
    box = driver.execute_script("const r = document.getElementById('submit').getBoundingClientRect();"
                                "return [r.top, r.bottom, innerHeight];")
    assert 0 <= box[0] and box[1] <= box[2], box
    driver.execute_script("document.getElementById('hires').click()")  # a longer form: still in sight
    box = driver.execute_script("const r = document.getElementById('submit').getBoundingClientRect();"
                                "return [r.top, r.bottom, innerHeight];")
    assert 0 <= box[0] and box[1] <= box[2], box
    driver.execute_script("document.getElementById('hires').click()")
    driver.save_screenshot(str(tmp_path / "page-1280x900.png"))


def test_model_picker_batch_count_and_ctrl_enter(page):
    driver, url, _ = page
    picker = Select(driver.find_element(By.ID, "model-pick"))
    assert [o.text for o in picker.options] == [FIRST, SECOND] and picker.first_selected_option.text == FIRST
    assert driver.find_element(By.ID, "width").get_attribute("value") == "512"  # the first records no size
    picker.select_by_visible_text(SECOND)
    _until(driver, lambda d: d.find_element(By.ID, "width").get_attribute("value") == "64", "the model's size")
    _set(driver, steps=1, seed=41, batch=3)
    before = {job["id"] for job in _jobs(url)}
    driver.find_element(By.ID, "prompt").send_keys(Keys.CONTROL, Keys.ENTER)
    made = _new_jobs(url, before, 3)
    assert [job["seed"] for job in made] == [41, 42, 43]  # consecutive seeds, as WebUI's batch count
    assert {job["model"] for job in made} == {SECOND} and {job["state"] for job in made} == {"completed"}
    assert all(job["params"]["width"] == 64 for job in made)
    _set(driver, batch=1)
    picker.select_by_visible_text(FIRST)


def test_png_info_by_drop_fills_the_form(page):
    driver, url, _ = page
    code, made = call(f"{url}/sdapi/v1/txt2img", {"prompt": "a dropped cat", "negative_prompt": "dogs", "seed": 77,
                                                  "steps": 3, "width": 48, "height": 32, "cfg_scale": 2.5,
                                                  "sampler_name": "Euler a", "scheduler": "karras",
                                                  "override_settings": {"sd_model_checkpoint": SECOND}})
    assert code == 200
    driver.execute_script("""
        const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0));
        const data = new DataTransfer();
        data.items.add(new File([bytes], "made.png", {type: "image/png"}));
        const target = document.getElementById("prompt");
        for (const type of ["dragover", "drop"]) {
          target.dispatchEvent(new DragEvent(type, {dataTransfer: data, bubbles: true, cancelable: true}));
        }""", made["images"][0])
    _until(driver, lambda d: d.find_element(By.ID, "prompt").get_attribute("value") == "a dropped cat", "PNG info")
    values = {name: driver.find_element(By.ID, name).get_attribute("value")
              for name in ("negative", "seed", "steps", "width", "height", "cfg", "sampler", "scheduler", "model-pick")}
    assert values == {"negative": "dogs", "seed": "77", "steps": "3", "width": "48", "height": "32", "cfg": "2.5",
                      "sampler": "euler_ancestral", "scheduler": "karras", "model-pick": SECOND}
    Select(driver.find_element(By.ID, "model-pick")).select_by_visible_text(FIRST)


def test_delete_and_clear_cancelled(page):
    driver, url, queue = page
    code, job = call(f"{url}/api/jobs", {"prompt": "to delete", "steps": 1, "width": 64, "height": 64})
    job = _wait(url, job)
    code, stopped = call(f"{url}/api/jobs", {"prompt": "to cancel", "steps": 1, "width": 64, "height": 64})
    call(f"{url}/api/jobs/{stopped['id']}/cancel", {})
    stopped = _wait(url, stopped)
    card = f'.result[data-id="{job["id"]}"]'
    _until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f"{card} button.delete"), "the result's card")
    driver.find_element(By.CSS_SELECTOR, f"{card} button.delete").click()
    _until(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, card), "the card gone")
    assert queue.get(job["id"]) is None
    if stopped["state"] == "cancelled":
        driver.find_element(By.ID, "clear-stopped").click()
        _until(driver, lambda d: queue.get(stopped["id"]) is None, "the cancelled job gone")
    assert not any(j["state"] in ("cancelled", "failed") for j in _jobs(url)) or stopped["state"] == "completed"


def test_size_warning_on_the_page(page):
    driver, url, _ = page
    code, job = call(f"{url}/api/jobs", {"prompt": "too small", "steps": 1, "width": 16, "height": 16,
                                         "model": SECOND})
    assert "16x16 is far from the 64x64 px" in job["warnings"][0]
    _wait(url, job)
    card = f'.result[data-id="{job["id"]}"] .warning'
    _until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, card), "the warning on the card")
    assert "far from the 64x64 px anima-second was trained at" in driver.find_element(By.CSS_SELECTOR, card).text
