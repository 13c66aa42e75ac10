"""The web page's image to image in a real headless browser (Debian's chromium under selenium, as test_page.py):
an init image from the file input, a drop and a gallery result; a mask painted with real pointer input, erased
and cleared; what the page sends (the request body it posts) and the jobs it makes."""

from __future__ import annotations

import base64
import hashlib
import io
import json

import pytest
from PIL import Image
from selenium.webdriver.common.actions import interaction
from selenium.webdriver.common.actions.action_builder import ActionBuilder
from selenium.webdriver.common.actions.pointer_input import PointerInput
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select
from test_page import _completed_card, _until, chromium
from test_server import call, running

SIZE = (72, 40)  # the init image: not multiples of 16 (the form's size rounds down: 64 x 32)
BRUSH = 24  # screen pixels


@pytest.fixture(scope="module")
def server(queue):
    with running(queue) as url:
        yield url, queue


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def _picture(path, size=SIZE):
    """A PNG: red on the left half, blue on the right, a green bar along the bottom."""
    image = Image.new("RGB", size, (30, 60, 220))
    image.paste((220, 40, 30), (0, 0, size[0] // 2, size[1]))
    image.paste((40, 200, 60), (0, size[1] - 6, size[0], size[1]))
    image.save(path)
    return path


def _open(driver, url):
    driver.get(f"{url}/")
    _until(driver, lambda d: d.find_element(By.ID, "steps").get_attribute("value") == "20", "the form's defaults")
    # Every body the page posts to /api/jobs, as sent.
    driver.execute_script("""
        window.sent = [];
        const fetchOf = window.fetch;
        window.fetch = (path, init) => {
          if (path === "/api/jobs" && init && init.method === "POST") window.sent.push(init.body);
          return fetchOf(path, init);
        };""")


def _label(driver, input_id):
    """The label of a radio or checkbox: what a user clicks."""
    return driver.find_element(By.XPATH, f"//input[@id='{input_id}']/ancestor::label")


def _sent(driver) -> list[dict]:
    return [json.loads(body) for body in driver.execute_script("return window.sent")]


def _submit(driver) -> dict:
    """Click Generate; the body the page posted."""
    count = len(_sent(driver))
    driver.find_element(By.ID, "submit").click()
    _until(driver, lambda d: len(_sent(d)) > count, "the page's request")
    return _sent(driver)[-1]


def _job_of(driver, queue, before: set[str]):
    return _until(driver, lambda d: next((j for j in queue.recent() if j.id not in before), None), "the job")


def _mask(driver) -> Image.Image | None:
    """The mask the page would send now (its maskPng()), decoded; None when nothing is painted."""
    data = driver.execute_async_script("maskPng().then(arguments[arguments.length - 1])")
    return None if data is None else Image.open(io.BytesIO(base64.b64decode(data)))


def _stroke(driver, points, kind=interaction.POINTER_MOUSE):
    """Real pointer input (webdriver actions: the browser's own pointer events) pressed at the first of `points`,
    moved through the others, released; points are the init image's pixels, mapped to where they show."""
    left, top, scale_x, scale_y = driver.execute_script(
        "const c = document.getElementById('mask-canvas'), b = c.getBoundingClientRect();"
        "return [b.left, b.top, b.width / c.width, b.height / c.height];")
    screen = [(round(left + (x + 0.5) * scale_x), round(top + (y + 0.5) * scale_y)) for x, y in points]
    actions = ActionBuilder(driver, mouse=PointerInput(kind, kind))
    actions.pointer_action.move_to_location(*screen[0]).pointer_down()
    for point in screen[1:]:
        actions.pointer_action.move_to_location(*point)
    actions.pointer_action.pointer_up()
    actions.perform()


def _grey(mask: Image.Image, *points) -> list[int]:
    grey = mask.convert("L")
    return [grey.getpixel(point) for point in points]


def _set_range(driver, input_id, value):
    driver.execute_script("const i = document.getElementById(arguments[0]); i.value = arguments[1];"
                          "i.dispatchEvent(new Event('input'));", input_id, str(value))


def test_img2img_loads_an_image_paints_a_mask_and_inpaints(server, browser, tmp_path):
    url, queue = server
    _open(browser, url)
    # Text to image first: the image controls hidden, the hires fix there, the strength at the table's default.
    assert not browser.find_element(By.ID, "img2img").is_displayed()
    assert browser.find_element(By.ID, "hires").is_displayed()
    assert not browser.find_element(By.ID, "strength-row").is_displayed()
    assert browser.find_element(By.ID, "strength").get_attribute("value") == "0.75"
    # The mode switch is radios: the keyboard's arrows choose.
    browser.execute_script("document.getElementById('mode-txt2img').focus()")
    browser.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
    assert browser.find_element(By.ID, "mode-img2img").is_selected()
    assert browser.find_element(By.ID, "img2img").is_displayed()
    assert not browser.find_element(By.ID, "hires-block").is_displayed()
    assert browser.find_element(By.ID, "strength-value").text == "0.75"
    assert [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "masked_content")).options] == [
        "fill", "original", "latent_noise", "latent_nothing"]
    assert Select(browser.find_element(By.ID, "masked_content")).first_selected_option.get_attribute(
        "value") == "original"
    assert Select(browser.find_element(By.ID, "resize_mode")).first_selected_option.get_attribute(
        "value") == "just_resize"
    assert browser.find_element(By.ID, "mask_blur").get_attribute("value") == "4"

    # Every control of the form has a name a screen reader says (its label, or an aria-label), and the page loads
    # nothing from elsewhere (everything inline; the server's CSP allows only its own origin and blobs).
    unnamed = browser.execute_script(
        "return [...document.querySelectorAll('#generate input, #generate select, #generate textarea')]"
        ".filter((c) => !c.labels.length && !c.getAttribute('aria-label')).map((c) => c.id);")
    assert unnamed == []
    assert browser.execute_script("return performance.getEntriesByType('resource').map((r) => r.name)"
                                  ".filter((name) => !name.startsWith(location.origin + '/'))") == []
    assert not any(word in call(f"{url}/")[1].decode() for word in ("http:", "https:", "src=", "href=", "url("))

    # Without an init image the page says what is missing and sends nothing.
    browser.find_element(By.ID, "submit").click()
    error = _until(browser, lambda d: d.find_element(By.ID, "error-text").text, "the error message")
    assert error.startswith("image to image needs an init image") and _sent(browser) == []

    # The file input: the picture on the canvas at its own size, the form's size from it (multiples of 16).
    path = _picture(tmp_path / "init.png")
    browser.find_element(By.ID, "init-file").send_keys(str(path))
    _until(browser, lambda d: d.find_element(By.ID, "init-info").text == "init.png · 72×40", "the init image")
    assert browser.execute_script("const c = document.getElementById('init-canvas'), m = "
                                  "document.getElementById('mask-canvas'); return [c.width, c.height, m.width, "
                                  "m.height, c.getBoundingClientRect().width > 200];") == [72, 40, 72, 40, True]
    pixels = browser.execute_script("const c = document.getElementById('init-canvas').getContext('2d');"
                                    "return [[5, 5], [60, 5], [30, 38]].map(([x, y]) => "
                                    "Array.from(c.getImageData(x, y, 1, 1).data.slice(0, 3)));")
    assert pixels == [[220, 40, 30], [30, 60, 220], [40, 200, 60]]
    assert [browser.find_element(By.ID, side).get_attribute("value") for side in ("width", "height")] == ["64", "32"]
    assert _mask(browser) is None  # nothing painted yet

    # Paint a stroke with the mouse: the mask at the image's size, white under the stroke, black elsewhere.
    _set_range(browser, "brush-size", BRUSH)
    assert browser.find_element(By.ID, "brush-size-value").text == str(BRUSH)
    _stroke(browser, [(8, 10), (20, 10), (30, 10)])
    mask = _mask(browser)
    assert mask.size == SIZE
    assert _grey(mask, (8, 10), (14, 10), (26, 10), (30, 10)) == [255] * 4
    assert _grey(mask, (60, 10), (20, 30), (8, 25), (45, 10)) == [0] * 4

    # Erase part of it with a finger (touch input): that part black again, the rest still white.
    browser.find_element(By.ID, "brush-erase").find_element(By.XPATH, "..").click()
    assert browser.find_element(By.ID, "brush-erase").is_selected()
    _stroke(browser, [(24, 10), (34, 10)], kind=interaction.POINTER_TOUCH)
    mask = _mask(browser)
    assert _grey(mask, (8, 10), (14, 10)) == [255, 255]
    assert _grey(mask, (26, 10), (30, 10)) == [0, 0]
    # Clear: no mask at all, and a submit sends none (a plain img2img job).
    browser.find_element(By.ID, "mask-clear").click()
    assert _mask(browser) is None
    before = {job.id for job in queue.recent()}
    browser.find_element(By.ID, "prompt").clear()
    browser.find_element(By.ID, "prompt").send_keys("a red circle")
    steps = browser.find_element(By.ID, "steps")
    steps.clear()
    steps.send_keys("4")
    body = _submit(browser)
    assert "mask" not in body and "inpainting_fill" not in body and "outpaint" not in body
    assert (body["width"], body["height"], body["denoising_strength"], body["resize_mode"]) == (
        64, 32, 0.75, "just_resize")
    assert base64.b64decode(body["init_image"]) == path.read_bytes()  # the file's own bytes
    plain = _job_of(browser, queue, before)
    assert plain.params.mask is None and plain.params.strength == 0.75
    assert plain.params.init_image.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()

    # Paint again (a pen this time), strength down with the keyboard: an inpainting job with the mask sent.
    browser.find_element(By.ID, "brush-paint").find_element(By.XPATH, "..").click()
    _stroke(browser, [(40, 20), (50, 20), (60, 24)], kind=interaction.POINTER_PEN)
    strength = browser.find_element(By.ID, "strength")
    strength.send_keys(*[Keys.ARROW_LEFT] * 25)  # 0.01 a press
    assert browser.find_element(By.ID, "strength-value").text == "0.50"
    Select(browser.find_element(By.ID, "masked_content")).select_by_value("fill")
    before = {job.id for job in queue.recent()}
    body = _submit(browser)
    assert body["denoising_strength"] == 0.5
    assert (body["inpainting_fill"], body["mask_blur"], body["inpainting_mask_invert"], body["inpaint_area"]) == (
        "fill", 4, False, "whole")
    sent = base64.b64decode(body["mask"])
    mask = Image.open(io.BytesIO(sent))
    assert mask.size == SIZE
    assert _grey(mask, (40, 20), (50, 20), (60, 24)) == [255] * 3 and _grey(mask, (10, 10), (20, 35)) == [0, 0]
    job = _job_of(browser, queue, before)
    assert job.params.mask.sha256 == hashlib.sha256(sent).hexdigest()
    stored = call(f"{url}/api/jobs/{job.id}")[1]["params"]  # as the native API reports the job
    assert stored["mask"]["sha256"] == hashlib.sha256(sent).hexdigest()
    assert stored["init_image"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (job.params.strength, job.params.masked_content) == (0.5, "fill")

    # Both jobs complete and show in the gallery, each with its mode.
    assert "img2img strength 0.75" in _completed_card(browser, plain.id).text
    card = _completed_card(browser, job.id)
    assert "seed" in card.text and "64×32" in card.text and "inpaint strength 0.5" in card.text
    _until(browser, lambda d: d.execute_script(
        "const i = document.querySelector(arguments[0]); return i && i.naturalWidth;",
        f'.result[data-id="{job.id}"] img') == 64, "the result's image")
    assert not browser.find_element(By.ID, "error").is_displayed()

    # "send to img2img": the result's PNG becomes the init image (its bytes as the server made them), mask empty.
    png = call(f"{url}/api/jobs/{job.id}/image")[1]
    browser.find_element(By.ID, "mode-txt2img").find_element(By.XPATH, "..").click()
    assert not browser.find_element(By.ID, "img2img").is_displayed()
    card.find_element(By.CSS_SELECTOR, "button.send").click()
    _until(browser, lambda d: d.find_element(By.ID, "init-info").text == f"result {job.id} · 64×32", "the result")
    assert browser.find_element(By.ID, "mode-img2img").is_selected()
    assert browser.find_element(By.ID, "img2img").is_displayed()
    assert base64.b64decode(browser.execute_script("return init.base64")) == png
    assert browser.execute_script("const c = document.getElementById('init-canvas'); return [c.width, c.height]") \
        == [64, 32]
    shown = browser.execute_script("const c = document.getElementById('init-canvas');"
                                   "return Array.from(c.getContext('2d').getImageData(0, 0, 64, 32).data);")
    assert bytes(shown) == Image.open(io.BytesIO(png)).convert("RGBA").tobytes()
    assert _mask(browser) is None
    assert [browser.find_element(By.ID, side).get_attribute("value") for side in ("width", "height")] == ["64", "32"]
    before = {job.id for job in queue.recent()}
    body = _submit(browser)
    assert base64.b64decode(body["init_image"]) == png and "mask" not in body
    again = _job_of(browser, queue, before)
    _completed_card(browser, again.id)
    assert again.params.init_image.sha256 == hashlib.sha256(png).hexdigest()


def test_a_dropped_image_outpaints_and_text_to_image_takes_the_hires_fix(server, browser, tmp_path):
    url, queue = server
    _open(browser, url)
    _label(browser, "mode-img2img").click()
    # A file dropped on the image area (a drop event with the file, as the browser makes one).
    path = _picture(tmp_path / "drop.png", (40, 24))
    browser.execute_script("""
        const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], "drop.png", {type: "image/png"}));
        document.getElementById("canvas-area").dispatchEvent(
          new DragEvent("drop", {dataTransfer: transfer, bubbles: true, cancelable: true}));""",
                           base64.b64encode(path.read_bytes()).decode())
    _until(browser, lambda d: d.find_element(By.ID, "init-info").text == "drop.png · 40×24", "the dropped image")
    assert [browser.find_element(By.ID, side).get_attribute("value") for side in ("width", "height")] == ["32", "16"]
    # Outpaint 16 px right and 8 down: the form's size grows with it; outpainting sends no mask (it makes its own).
    for side, pixels in (("right", 16), ("bottom", 8)):
        field = browser.find_element(By.ID, f"outpaint-{side}")
        field.clear()
        field.send_keys(str(pixels), Keys.TAB)
    assert [browser.find_element(By.ID, side).get_attribute("value") for side in ("width", "height")] == ["48", "32"]
    steps = browser.find_element(By.ID, "steps")
    steps.clear()
    steps.send_keys("2")
    before = {job.id for job in queue.recent()}
    body = _submit(browser)
    assert body["outpaint"] == [0, 0, 16, 8] and "mask" not in body
    assert (body["width"], body["height"], body["inpainting_fill"]) == (48, 32, "original")
    job = _job_of(browser, queue, before)
    assert job.params.outpaint == (0, 0, 16, 8)
    assert "outpaint strength 0.75" in _completed_card(browser, job.id).text

    # Text to image with the hires fix: its options and the strength show once it is on, and are sent.
    _label(browser, "mode-txt2img").click()
    assert not browser.find_element(By.ID, "hires-options").is_displayed()
    _label(browser, "hires").click()
    assert browser.find_element(By.ID, "hires-options").is_displayed()
    assert browser.find_element(By.ID, "strength-row").is_displayed()
    assert browser.find_element(By.ID, "hires_scale").get_attribute("value") == "2"
    assert [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "hires_upscaler")).options] == [
        "latent", "latent-bicubic", "latent-nearest-exact", "lanczos"]
    for name, value in (("width", 32), ("height", 32), ("hires_scale", 1.5), ("hires_steps", 2)):
        field = browser.find_element(By.ID, name)
        field.clear()
        field.send_keys(str(value))
    _set_range(browser, "strength", 0.6)
    before = {job.id for job in queue.recent()}
    body = _submit(browser)
    assert "init_image" not in body and "outpaint" not in body
    assert (body["enable_hr"], body["hr_scale"], body["hr_second_pass_steps"], body["hr_upscaler"],
            body["denoising_strength"]) == (True, 1.5, 2, "latent", 0.6)
    job = _job_of(browser, queue, before)
    assert job.params.hires and job.params.hires_size() == (48, 48)
    assert "hires fix ×1.5 strength 0.6" in _completed_card(browser, job.id).text
    # Unticked, it is plain text to image again: no hires field, no strength.
    _label(browser, "hires").click()
    assert not browser.find_element(By.ID, "strength-row").is_displayed()
    body = _submit(browser)
    assert not {"enable_hr", "denoising_strength", "init_image"} & set(body)
    _until(browser, lambda d: d.find_element(By.ID, "idle").is_displayed(), "the queue to empty")
    assert not browser.find_element(By.ID, "error").is_displayed()
