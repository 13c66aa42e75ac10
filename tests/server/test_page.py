"""The web page of `anima-rknn serve` in a real headless browser (Debian's chromium driven by selenium), and the
compare-with-baseline API behind its button."""

from __future__ import annotations

import contextlib
import io
import re
import time
from pathlib import Path

import pytest
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait
from test_server import call, running

from anima_rknn.bench.metrics import difference_map, psnr, ssim
from anima_rknn.server.store import FINISHED

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")  # Debian's, from apt
CACHED = {"width": 64, "height": 64, "steps": 12, "cache": "spectrum"}  # spectrum skips 4 of 12 steps
LONG = {"prompt": "a long one", "width": 256, "height": 256, "steps": 1000, "cache": "none"}  # cancelled midway
KEY = "anima-rknn-api-key"  # where the page keeps the key (localStorage)


@pytest.fixture(scope="module")
def server(queue):
    with running(queue, max_steps=1000) as url:
        yield url, queue


@contextlib.contextmanager
def chromium():
    """Debian's headless chromium under selenium, quit on leaving (test_page_img2img.py uses it too)."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.is_file()]
    if missing:
        pytest.fail(f"{' and '.join(missing)} missing: run scripts/test.sh as root, which installs Debian's "
                    "chromium and chromium-driver with apt", pytrace=False)
    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,1300", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")  # the paths are given: selenium must never fetch a browser or driver
        driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def _until(driver, check, what: str, seconds: float = 120):
    return WebDriverWait(driver, seconds, poll_frequency=0.1).until(check, f"waited for {what}")


def _loaded(driver, css: str) -> int:
    """naturalWidth of the image at `css` (0 until its picture arrived)."""
    return driver.execute_script("const i = document.querySelector(arguments[0]); return i ? i.naturalWidth : 0;", css)


def _fill(driver, **fields) -> None:
    for name, value in fields.items():
        field = driver.find_element(By.ID, name)
        if name == "cache":
            Select(field).select_by_visible_text(value)
        elif field.tag_name == "select":
            Select(field).select_by_value(value)
        else:
            field.clear()
            field.send_keys(str(value))
    driver.find_element(By.ID, "submit").click()


def _submit(url: str, body: dict) -> dict:
    code, job = call(f"{url}/api/jobs", body)
    assert code == 200, job
    return job


def _wait(url: str, job: dict) -> dict:
    deadline = time.monotonic() + 120
    while job["state"] not in FINISHED:
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.05)
        job = call(f"{url}/api/jobs/{job['id']}")[1]
    return job


def _finished(url: str, body: dict) -> dict:
    return _wait(url, _submit(url, body))


def test_the_page_generates_shows_progress_cancels_and_compares(server, browser, tmp_path):
    url, queue = server
    browser.get(f"{url}/")
    _until(browser, lambda d: d.find_element(By.ID, "model").text == "tiny", "the model name")
    # The form is the server's settings table: its defaults, limits and the cache names it knows.
    _until(browser, lambda d: d.find_element(By.ID, "steps").get_attribute("value") == "20", "the form's defaults")
    assert [browser.find_element(By.ID, side).get_attribute(attribute) for side in ("width", "height")
            for attribute in ("value", "max")] == ["512", "1024"] * 2
    assert browser.find_element(By.ID, "seed").get_attribute("value") == "-1"
    assert [o.text for o in Select(browser.find_element(By.ID, "cache")).options] == [
        "none", "spectrum", "spectrum-plus", "reuse", "auto"]
    assert [o.text for o in Select(browser.find_element(By.ID, "scheduler")).options][:3] == [
        "simple", "normal", "karras"]
    # Samplers by our names, A1111's display name beside where it differs; eta and s_noise empty: the sampler's own.
    assert [o.text for o in Select(browser.find_element(By.ID, "sampler")).options][:5] == [
        "euler", "euler_ancestral (Euler a)", "heun", "dpmpp_2m (DPM++ 2M)", "dpmpp_2m_sde (DPM++ 2M SDE)"]
    assert Select(browser.find_element(By.ID, "sampler")).first_selected_option.get_attribute("value") == "euler"
    assert [browser.find_element(By.ID, name).get_attribute("value") for name in ("eta", "s_noise")] == ["", ""]

    _fill(browser, width=4096)  # the API's one-line answer is shown as it is
    error = _until(browser, lambda d: d.find_element(By.ID, "error-text").text, "the error message")
    assert error.startswith("width and height must be from 16 to 1024")

    # A long job: its progress bar and live preview show while it runs; its cancel button stops it.
    _fill(browser, **LONG)
    _until(browser, lambda d: _loaded(d, "#preview"), "the live preview")
    assert browser.find_element(By.ID, "preview").is_displayed()
    assert not browser.find_element(By.ID, "error").is_displayed()
    assert re.match(r"step \d+ / 1000 · ETA ", browser.find_element(By.ID, "progress-text").text)
    assert browser.find_element(By.ID, "progress-fill").get_attribute("style").startswith("width:")
    browser.find_element(By.ID, "running-cancel").click()
    cancelled = _until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '.result[data-state="cancelled"]'),
                       "the cancelled job")
    assert re.search(r"cancelled at step \d+/1000", cancelled[0].text)

    # A cached job, then its comparison with the uncached twin.
    _fill(browser, prompt="a red circle", seed=5, **CACHED)
    card = _until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '.result[data-state="completed"]'),
                  "the result in the gallery")[0]
    _until(browser, lambda d: _loaded(d, '.result[data-state="completed"] img') == 64, "the result's image")
    assert "seed 5 · 64×64 · 12 steps · CFG 4 · cache spectrum" in card.text
    assert re.search(r"8/12 steps computed · denoise [\d.]+ s", card.text)
    card.find_element(By.CSS_SELECTOR, "button.compare").click()
    _until(browser, lambda d: d.find_element(By.ID, "numbers").is_displayed(), "the comparison's numbers")
    for image in ("#compare-cached", "#compare-baseline", "#compare-difference"):
        assert _loaded(browser, image) == 64, image
    job_id = card.get_attribute("data-id")
    twin = next(job for job in queue.recent() if job.params.cache == "none" and job.params.seed == 5)
    measured = call(f"{url}/api/jobs/{job_id}/compare/{twin.id}")[1]
    assert browser.find_element(By.ID, "psnr").text == f"{measured['psnr_db']:.2f} dB"
    assert browser.find_element(By.ID, "ssim").text == f"{measured['ssim']:.4f}"
    assert browser.find_element(By.ID, "speedup").text == f"{measured['speedup']:.2f}×"
    assert browser.find_element(By.ID, "computed").text == "8 / 12"
    assert browser.find_element(By.ID, "caption-difference").text == \
        f"difference: black equal, brightest {round(measured['difference_max'])}/255"
    assert not browser.find_element(By.ID, "error").is_displayed()

    _until(browser, lambda d: d.find_element(By.ID, "idle").is_displayed(), "the page to see the queue empty")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".result")) == 3  # the twin joined the gallery
    browser.save_screenshot(str(tmp_path / "page.png"))
    assert Image.open(tmp_path / "page.png").width == 1280


def _completed_card(driver, job_id: str):
    """The gallery card of the job, once it shows the job completed."""
    selector = f'.result[data-id="{job_id}"][data-state="completed"]'
    return _until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, selector), f"job {job_id} in the gallery")[0]


def test_the_page_runs_the_sampler_chosen_with_its_eta(server, browser):
    url, queue = server
    browser.get(f"{url}/")
    _until(browser, lambda d: d.find_element(By.ID, "steps").get_attribute("value") == "20", "the form's defaults")
    # eta given to a sampler without one: the server's one line, shown as it is.
    _fill(browser, prompt="a red circle", width=64, height=64, steps=2, seed=21, sampler="euler", eta=0.5)
    error = _until(browser, lambda d: d.find_element(By.ID, "error-text").text, "the error message")
    assert error.startswith("sampler euler has no eta; these do: euler_ancestral, dpmpp_2m_sde")
    before = {job.id for job in queue.recent()}
    _fill(browser, sampler="euler_ancestral", eta=0.5, seed=22)
    job = _until(browser, lambda d: next((j for j in queue.recent() if j.id not in before), None), "the job")
    assert (job.params.sampler, job.params.eta, job.params.s_noise) == ("euler_ancestral", 0.5, None)
    card = _completed_card(browser, job.id)
    assert "seed 22 · 64×64 · 2 steps · CFG 4 · cache none · euler_ancestral" in card.text
    assert not browser.find_element(By.ID, "error").is_displayed()
    # heun calls the model twice a step (not on the last): the card counts model calls.
    before = {job.id for job in queue.recent()}
    eta = browser.find_element(By.ID, "eta")
    eta.clear()
    _fill(browser, sampler="heun", steps=3, seed=23)
    job = _until(browser, lambda d: next((j for j in queue.recent() if j.id not in before), None), "the heun job")
    assert (job.params.sampler, job.params.eta) == ("heun", None)
    text = _completed_card(browser, job.id).text
    assert re.search(r"5/5 model calls computed · denoise", text) and "· heun" in text


def test_the_page_sends_the_credentials_it_is_given(queue, browser):
    with running(queue, api_key="s3cret", api_auth="ann:pw") as url:
        browser.get(f"{url}/")  # the page itself needs no credentials; everything it calls does
        error = _until(browser, lambda d: d.find_element(By.ID, "error-text").text, "the 401")
        assert error == "authentication required: enter the server's API key at the top right"
        stored = "return localStorage.getItem(arguments[0])"
        for key in ("ann:pw", "s3cret"):  # HTTP basic, then the Bearer token
            field = browser.find_element(By.ID, "api-key")
            field.clear()
            field.send_keys(f"{key}\t")
            _until(browser, lambda d, key=key: d.execute_script(stored, KEY) == key, key)
            _until(browser, lambda d: not d.find_element(By.ID, "error").is_displayed(), "the error to clear")
            _until(browser, lambda d: d.find_element(By.ID, "model").text == "tiny", "the model name")
            assert browser.find_elements(By.CSS_SELECTOR, ".result")  # the queue's jobs, listed with the key


@pytest.fixture(scope="module")
def jobs(server) -> dict[str, dict]:
    """A completed cached job, a completed uncached one, and a cached one cancelled while it waited."""
    url, _ = server
    made = {"cached": _finished(url, {"prompt": "a cat", "seed": 7, **CACHED}),
            "plain": _finished(url, {"prompt": "a dog", "seed": 8, **CACHED, "cache": "none", "steps": 2})}
    blocker = _submit(url, LONG)
    waiting = _submit(url, {"prompt": "a fox", "seed": 9, **CACHED})
    for job in (waiting, blocker):
        call(f"{url}/api/jobs/{job['id']}/cancel", {})
    made["cancelled"] = _wait(url, waiting)
    assert made["cancelled"]["state"] == "cancelled" and _wait(url, blocker)["state"] == "cancelled"
    return made


def test_compare_measures_the_cached_job_against_its_uncached_twin(server, jobs):
    url, _ = server
    job = jobs["cached"]
    blocker = _submit(url, LONG)  # holds the twin back, to see the answer while it waits
    code, twin = call(f"{url}/api/jobs/{job['id']}/compare", {})
    assert code == 200 and twin["state"] == "queued"
    assert twin["params"] == {**job["params"], "cache": "none", "cache_options": {}}
    assert call(f"{url}/api/jobs/{job['id']}/compare", {})[1]["id"] == twin["id"]  # a second click: the same twin
    pair = f"{url}/api/jobs/{job['id']}/compare/{twin['id']}"
    code, waiting = call(pair)
    assert code == 200 and not waiting["ready"] and waiting["twin"]["state"] == "queued"
    assert call(f"{pair}/difference")[0] == 409
    call(f"{url}/api/jobs/{blocker['id']}/cancel", {})
    twin = _wait(url, twin)
    code, answer = call(pair)
    assert code == 200 and answer["ready"] and answer["twin"]["state"] == "completed"
    cached, baseline = (Image.open(io.BytesIO(call(f"{url}/api/jobs/{j['id']}/image")[1])) for j in (job, twin))
    assert answer["psnr_db"] == pytest.approx(psnr(baseline, cached)) and 0 < answer["psnr_db"] < 100
    assert answer["ssim"] == pytest.approx(ssim(baseline, cached)) and answer["ssim"] < 1
    assert 0 < answer["difference_max"] == pytest.approx(difference_map(baseline, cached).max())
    assert answer["denoise_s"] == {"cached": job["result"]["timings"]["denoise_s"],
                                   "baseline": twin["result"]["timings"]["denoise_s"]}
    assert answer["speedup"] == pytest.approx(answer["denoise_s"]["baseline"] / answer["denoise_s"]["cached"])
    assert answer["computed_steps"] == {"cached": 8, "baseline": 12}
    code, png = call(f"{pair}/difference")
    difference = Image.open(io.BytesIO(png))
    assert code == 200 and difference.size == (64, 64) and difference.mode == "RGB"
    assert len(difference.getcolors(64 * 64)) > 1  # the pictures differ, and the map shows where


@pytest.mark.parametrize("method, path, code, pattern", [
    ("POST", "/api/jobs/nope/compare", 404, "no job 'nope'"),
    ("GET", "/api/jobs/nope/compare/{cached}", 404, "no job 'nope'"),
    ("GET", "/api/jobs/{cached}/compare/nope", 404, "no job 'nope'"),
    ("GET", "/api/jobs/{cached}/compare/nope/difference", 404, "no job 'nope'"),
    ("POST", "/api/jobs/{plain}/compare", 400, "ran without a cache: it is its own baseline"),
    ("GET", "/api/jobs/{plain}/compare/{cached}", 400, "ran without a cache"),
    ("GET", "/api/jobs/{cached}/compare/{plain}", 400, "is not the uncached twin of job"),
    ("GET", "/api/jobs/{cached}/compare/{cached}/difference", 400, "is not the uncached twin of job"),
    ("POST", "/api/jobs/{cancelled}/compare", 409, "cancelled: there is nothing to compare"),
])
def test_bad_comparisons_get_a_4xx_with_one_line(server, jobs, method, path, code, pattern):
    url, _ = server
    got, answer = call(url + path.format(**{name: job["id"] for name, job in jobs.items()}),
                       {} if method == "POST" else None)
    assert got == code, answer
    assert pattern in answer["error"] and "\n" not in answer["error"]
