"""The web page's results as a WebUI user meets them, in a real headless browser (Debian's chromium under selenium,
as test_page.py): the form's defaults from the model (its trained size), every sampler and cache of the server, the
LoRA picker over --lora-dir, a result's full-size view and download (the server's PNG, byte for byte), "reuse
settings" / "reuse seed", the paged gallery, and a picture that WebUI's interrupt cut short."""

from __future__ import annotations

import base64
import threading
import time

import pytest
from lora_files import comfy, random_pairs, write_lora
from PIL import Image
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select
from test_page import LONG, _completed_card, _submit, _until, _wait, chromium
from test_server import call, png, running

from anima_rknn.model.io import read_dit_config

NATIVE = 64  # the model's trained size, as serve reads it from a small trained model's DiT (the demo's is 64)
PER_PAGE = 12  # the page's gallery page
SMALL = {"width": 32, "height": 32, "steps": 1}


@pytest.fixture(scope="module")
def server(queue, tiny_set, tmp_path_factory):
    folder = tmp_path_factory.mktemp("loras")
    config = read_dit_config(tiny_set.dit)
    for seed, name in enumerate(("ink", "style"), start=1):
        write_lora(folder / f"{name}.safetensors", comfy(random_pairs(config, seed=seed, strength=1.0)))
    with running(queue, native_size=NATIVE, lora_dir=folder, max_steps=1000) as url:
        yield url, queue


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def _open(driver, url) -> None:
    """The page loaded, its form filled from /api/settings and its LoRA list from /sdapi/v1/loras."""
    driver.get(f"{url}/")
    _until(driver, lambda d: d.find_element(By.ID, "steps").get_attribute("value") == "20", "the form's defaults")
    _until(driver, lambda d: len(Select(d.find_element(By.ID, "lora-add")).options) > 1, "the LoRA list")


def _values(driver, *ids) -> list[str]:
    return [driver.find_element(By.ID, name).get_attribute("value") for name in ids]


def _set(driver, **fields) -> None:
    for name, value in fields.items():
        field = driver.find_element(By.ID, name)
        if field.tag_name == "select":
            Select(field).select_by_value(value)
        else:
            field.clear()
            field.send_keys(str(value))


def _new_job(driver, queue, before: set[str]):
    return _until(driver, lambda d: next((j for j in queue.recent() if j.id not in before), None), "the page's job")


def _settings(url: str) -> dict[str, dict]:
    return {entry["field"]: entry for entry in call(f"{url}/api/settings")[1]}


def test_the_form_has_the_models_size_and_every_sampler_and_cache(server, browser):
    url, _ = server
    _open(browser, url)
    # The model's trained size, not 512: the server's defaults (a 512-px picture of a 64-px model is a flat field).
    assert _values(browser, "width", "height") == [str(NATIVE)] * 2
    settings = _settings(url)
    assert settings["width"]["default"] == NATIVE
    for field, input_id in (("sampler_name", "sampler"), ("cache", "cache"), ("scheduler", "scheduler")):
        shown = [option.get_attribute("value") for option in Select(browser.find_element(By.ID, input_id)).options]
        assert shown == settings[field]["choices"], field
    assert "auto" in settings["cache"]["choices"] and len(settings["sampler_name"]["choices"]) > 5


def test_the_lora_picker_sends_the_loras_picked_with_their_scales(server, browser):
    url, queue = server
    _open(browser, url)
    picker = Select(browser.find_element(By.ID, "lora-add"))
    assert [option.text for option in picker.options] == ["add a LoRA…", "ink", "style"]
    picker.select_by_value("style")
    Select(browser.find_element(By.ID, "lora-add")).select_by_value("ink")
    assert [option.text for option in Select(browser.find_element(By.ID, "lora-add")).options] == ["add a LoRA…"]
    rows = browser.find_elements(By.CSS_SELECTOR, "#loras li")
    assert [row.get_attribute("data-name") for row in rows] == ["style", "ink"]
    scale = rows[0].find_element(By.TAG_NAME, "input")
    assert scale.get_attribute("value") == "1"
    scale.clear()
    scale.send_keys("0.7")
    before = {job.id for job in queue.recent()}
    _set(browser, prompt="a red circle", seed=41, sampler="dpmpp_2m", cache="auto", **(SMALL | {"steps": 2}))
    browser.find_element(By.ID, "submit").click()
    job = _new_job(browser, queue, before)
    assert [(ref.name, ref.scale) for ref in job.params.loras] == [("style", 0.7), ("ink", 1.0)]
    assert (job.params.sampler, job.params.cache) == ("dpmpp_2m", "auto")
    assert "· dpmpp_2m · LoRA style 0.7 · LoRA ink 1" in _completed_card(browser, job.id).text
    # Removed, a LoRA is offered again and sent no more.
    rows[1].find_element(By.TAG_NAME, "button").click()
    assert [option.text for option in Select(browser.find_element(By.ID, "lora-add")).options] == [
        "add a LoRA…", "ink"]
    assert [row.get_attribute("data-name") for row in browser.find_elements(By.CSS_SELECTOR, "#loras li")] == ["style"]


def test_reuse_settings_fills_the_form_and_remakes_the_job(server, browser):
    url, queue = server
    picked = _wait(url, _submit(url, {"prompt": "a red circle", "seed": 41, "sampler_name": "dpmpp_2m", "cache": "auto",
                                      "loras": [{"name": "style", "scale": 0.7}, {"name": "ink", "scale": 1}],
                                      **SMALL, "steps": 2}))
    _open(browser, url)
    card = _completed_card(browser, picked["id"])
    card.find_element(By.CSS_SELECTOR, "button.reuse").click()
    assert _values(browser, "prompt", "negative", "width", "height", "steps", "seed", "sampler", "cache") == [
        "a red circle", "", "32", "32", "2", "41", "dpmpp_2m", "auto"]
    assert [(row.get_attribute("data-name"), row.find_element(By.TAG_NAME, "input").get_attribute("value"))
            for row in browser.find_elements(By.CSS_SELECTOR, "#loras li")] == [("style", "0.7"), ("ink", "1")]
    before = {job.id for job in queue.recent()}
    browser.find_element(By.ID, "submit").click()
    again = _new_job(browser, queue, before)
    _completed_card(browser, again.id)
    assert call(f"{url}/api/jobs/{again.id}")[1]["params"] == call(f"{url}/api/jobs/{picked['id']}")[1]["params"]
    assert call(f"{url}/api/jobs/{again.id}/image")[1] == call(f"{url}/api/jobs/{picked['id']}/image")[1]  # the same

    # Image to image and the hires fix: every field the form has, from jobs cancelled while they waited (their
    # params are all reuse needs); the init image is not a setting: the one loaded stays.
    init = base64.b64encode(png(Image.new("RGB", (48, 32), (200, 30, 30)))).decode()
    mask = Image.new("L", (48, 32), 0)
    mask.paste(255, (0, 0, 24, 32))
    mask = base64.b64encode(png(mask)).decode()
    blocker = _submit(url, LONG)
    image_job = _submit(url, {"prompt": "inpainted", "negative_prompt": "blur", "init_image": init, "mask": mask,
                              "denoising_strength": 0.4, "resize_mode": "crop_and_resize", "mask_blur": 2,
                              "inpainting_fill": "latent_noise", "inpaint_area": "masked",
                              "inpaint_full_res_padding": 8, "inpainting_mask_invert": True, "seed": 2**64 - 3,
                              "sampler_name": "euler_ancestral", "eta": 0.3, "s_noise": 0.9, "shift": 2.5,
                              "scheduler": "karras", "cfg_scale": 5.5, "steps": 3})
    outpaint_job = _submit(url, {"prompt": "grown", "init_image": init, "outpaint": [16, 0, 32, 8], "steps": 3})
    hires_job = _submit(url, {"prompt": "hires", "enable_hr": True, "hr_scale": 1.5, "hr_second_pass_steps": 2,
                              "hr_upscaler": "lanczos", "denoising_strength": 0.6, "steps": 3})
    for job in (image_job, outpaint_job, hires_job, blocker):
        call(f"{url}/api/jobs/{job['id']}/cancel", {})
        _wait(url, job)
    image_card = _until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f'.result[data-id="{image_job["id"]}"]'),
                        "the cancelled image job")[0]
    image_card.find_element(By.CSS_SELECTOR, "button.reuse").click()
    assert browser.find_element(By.ID, "mode-img2img").is_selected()
    assert browser.find_element(By.ID, "img2img").is_displayed()
    assert _values(browser, "prompt", "negative", "width", "height", "steps", "cfg", "seed", "sampler", "scheduler",
                   "shift", "eta", "s_noise", "strength", "resize_mode", "masked_content", "inpaint_area",
                   "inpaint_padding", "mask_blur") == [
        "inpainted", "blur", "48", "32", "3", "5.5", str(2**64 - 3), "euler_ancestral", "karras", "2.5", "0.3", "0.9",
        "0.4", "crop_and_resize", "latent_noise", "masked", "8", "2"]
    assert browser.find_element(By.ID, "invert_mask").is_selected()
    assert browser.find_element(By.ID, "strength-value").text == "0.40"  # the slider's number follows
    assert browser.find_elements(By.CSS_SELECTOR, "#loras li") == []  # the job had none: the picked ones go
    browser.find_element(By.CSS_SELECTOR, f'.result[data-id="{outpaint_job["id"]}"] button.reuse').click()
    assert _values(browser, "outpaint-left", "outpaint-top", "outpaint-right", "outpaint-bottom") == [
        "16", "0", "32", "8"]
    assert _values(browser, "eta", "s_noise", "negative") == ["", "", ""]  # the sampler's own, the server's default
    browser.find_element(By.CSS_SELECTOR, f'.result[data-id="{hires_job["id"]}"] button.reuse').click()
    assert browser.find_element(By.ID, "mode-txt2img").is_selected()
    assert browser.find_element(By.ID, "hires").is_selected()
    assert browser.find_element(By.ID, "hires-options").is_displayed()
    assert _values(browser, "hires_scale", "hires_steps", "hires_upscaler", "strength", "outpaint-right",
                   "width") == ["1.5", "2", "lanczos", "0.6", "0", str(NATIVE)]

    # Reuse seed: the seed alone; the rest of the form stays as it is.
    _set(browser, steps=7)
    card = _completed_card(browser, picked["id"])
    card.find_element(By.CSS_SELECTOR, "button.reuse-seed").click()
    assert _values(browser, "seed", "steps", "prompt") == ["41", "7", "hires"]


def _downloads(driver, folder) -> None:
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(folder)})


def test_a_result_opens_full_size_and_downloads_as_the_server_made_it(server, browser, tmp_path):
    url, _ = server
    older = _wait(url, _submit(url, {"prompt": "an older one", **SMALL}))
    job = _wait(url, _submit(url, {"prompt": "a blue square", "seed": 77, "width": NATIVE, "height": NATIVE,
                                   "steps": 1}))
    _open(browser, url)
    card = _completed_card(browser, job["id"])
    _until(browser, lambda d: card.find_element(By.CSS_SELECTOR, "a.download").get_attribute("href"), "the link")
    card.find_element(By.CSS_SELECTOR, "button.thumb").click()
    viewer = browser.find_element(By.ID, "viewer")
    _until(browser, lambda d: viewer.is_displayed() and d.find_element(By.ID, "viewer-size").text, "the view")
    image = browser.find_element(By.ID, "viewer-image")
    natural, shown = browser.execute_script("const i = arguments[0]; return [i.naturalWidth, i.width];", image)
    assert natural == NATIVE and shown == 8 * NATIVE  # a whole multiple (sharp pixels), at most 8x
    assert browser.find_element(By.ID, "viewer-size").text == f"64×64 px, shown at {100 * shown // NATIVE}%"
    assert browser.find_element(By.ID, "viewer-prompt").text == "a blue square"
    assert "seed 77 · 64×64 · 1 steps" in browser.find_element(By.ID, "viewer-settings").text

    # Download from the view: the server's PNG, byte for byte (its parameters text too), named for the job.
    _downloads(browser, tmp_path)
    link = browser.find_element(By.CSS_SELECTOR, "#viewer-actions a.download")
    name = f"anima-{job['id']}-77.png"
    assert link.get_attribute("download") == name
    link.click()
    saved = tmp_path / name
    _until(browser, lambda d: saved.is_file() and saved.stat().st_size > 0, "the download")
    served = call(f"{url}/api/jobs/{job['id']}/image")[1]
    assert saved.read_bytes() == served
    assert Image.open(saved).info["parameters"].startswith("a blue square\n")
    assert viewer.is_displayed()  # downloading keeps the view open

    # ← / → step through the page's results; Esc closes the view.
    assert browser.find_element(By.ID, "viewer-prev").get_attribute("disabled") == "true"  # the newest
    viewer.send_keys(Keys.ARROW_RIGHT)
    _until(browser, lambda d: d.find_element(By.ID, "viewer-prompt").text == older["params"]["prompt"], "the older")
    assert browser.find_element(By.ID, "viewer-size").text == "32×32 px, shown at " \
        f"{100 * browser.find_element(By.ID, 'viewer-image').size['width'] // 32}%"
    viewer.send_keys(Keys.ESCAPE)
    _until(browser, lambda d: not viewer.is_displayed(), "the view to close")
    # Its object URL let go (the dialog's close event comes a task later).
    _until(browser, lambda d: d.find_element(By.ID, "viewer-image").get_attribute("src") is None, "the URL let go")


def test_the_gallery_pages_its_results(server, browser, tmp_path):
    url, _ = server
    # Results enough for two pages, cheaply: a result, then jobs cancelled while a long one runs (finished at once).
    result = _wait(url, _submit(url, {"prompt": "on the second page", **SMALL}))
    blocker = _submit(url, LONG)
    for i in range(PER_PAGE):
        cancelled = _submit(url, {"prompt": f"waiting {i}", "seed": i, **SMALL})
        call(f"{url}/api/jobs/{cancelled['id']}/cancel", {})
    call(f"{url}/api/jobs/{blocker['id']}/cancel", {})
    _wait(url, blocker)
    listed = call(f"{url}/api/jobs?limit=200")[1]
    newest = [job["id"] for job in listed]
    total = len(newest)
    assert total > PER_PAGE
    _open(browser, url)

    def cards(driver) -> list[str]:
        # In one script: the cards change under a page turn.
        return driver.execute_script("return [...document.querySelectorAll('#gallery .result')]"
                                     ".map((n) => n.dataset.id)")

    pages = -(-total // PER_PAGE)
    _until(browser, lambda d: cards(d) == newest[:PER_PAGE], "the first page")
    assert browser.find_element(By.ID, "pager-text").text == f"page 1 of {pages}"
    assert browser.find_element(By.ID, "page-newer").get_attribute("disabled") == "true"
    browser.find_element(By.ID, "page-older").click()
    _until(browser, lambda d: cards(d) == newest[PER_PAGE:2 * PER_PAGE], "the second page")
    assert browser.find_element(By.ID, "pager-text").text == f"page 2 of {pages}"
    # A page is three rows of four at 1280 px, however many results the store holds.
    tops = browser.execute_script("return [...document.querySelectorAll('#gallery .result')].map((n) => n.offsetTop)")
    assert len(set(tops)) == 3
    browser.find_element(By.ID, "page-newer").click()
    _until(browser, lambda d: cards(d) == newest[:PER_PAGE], "the first page again")

    # One look as a user: the second page, with its result open full size.
    browser.find_element(By.ID, "page-older").click()
    _until(browser, lambda d: result["id"] in cards(d), "the second page again")
    _completed_card(browser, result["id"])
    browser.execute_script("window.scrollTo(0, document.getElementById('gallery').offsetTop - 80)")
    browser.save_screenshot(str(tmp_path / "gallery.png"))
    browser.find_element(By.CSS_SELECTOR, f'.result[data-id="{result["id"]}"] button.thumb').click()
    _until(browser, lambda d: d.find_element(By.ID, "viewer-size").text, "the view")
    browser.save_screenshot(str(tmp_path / "viewer.png"))
    for name in ("gallery.png", "viewer.png"):
        assert Image.open(tmp_path / name).size[0] == 1280
    browser.find_element(By.ID, "viewer-close").click()
    _until(browser, lambda d: not d.find_element(By.ID, "viewer").is_displayed(), "the view to close")


def test_a_picture_cut_short_by_webuis_interrupt_says_so_on_its_card(server, browser):
    url, queue = server
    answer = {}
    call_thread = threading.Thread(target=lambda: answer.update(result=call(
        f"{url}/sdapi/v1/txt2img", {"prompt": "cut short", "width": 32, "height": 32, "steps": 1000})))
    call_thread.start()
    while not (queue.current and queue.current.step >= 1):
        time.sleep(0.02)
    job = queue.current
    call(f"{url}/sdapi/v1/interrupt", {})
    call_thread.join(120)
    assert answer["result"][0] == 200
    _open(browser, url)
    card = _completed_card(browser, job.id)
    assert card.find_element(By.CSS_SELECTOR, ".state.interrupted").text == \
        f"interrupted at step {job.summary['interrupted']['step']}/1000"
    picture = card.find_element(By.CSS_SELECTOR, "img")
    _until(browser, lambda d: picture.get_attribute("naturalWidth") == "32", "the picture so far")
