"""Live previews: the published Wan 2.1 projection, projections fitted to a VAE's own decodes and stored beside
it (and refused when the stored file is not sound), and the step listener that writes them during real runs."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from crafted_files import write
from PIL import Image
from safetensors.torch import load_file, save_file

from anima_rknn.bench.metrics import psnr
from anima_rknn.core.files import is_temporary
from anima_rknn.core.tensorfile import read_metadata
from anima_rknn.demo import demo_model_dir
from anima_rknn.demo.train import META_PREFIX, DemoConfig, store_preview_projection
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.vae import WanVAEConfig, decode_tiled, file_shapes, load_vae, save_vae
from anima_rknn.vae.preview import (
    MAX_PREVIEW_BYTES,
    PREVIEW_FORMAT,
    LatentProjection,
    PreviewWriter,
    fit_file,
    fit_latents,
    fit_projection,
    preview_file,
    projection_for,
    published_wan21,
    read_projection,
    write_projection,
)

DEMO_PROMPT = "a red circle on a blue background, top left"


def vae_image(pixels: torch.Tensor) -> Image.Image:
    """The first decoded image as 8-bit RGB, rounded as the pipeline rounds its output."""
    return Image.fromarray((pixels[0].permute(1, 2, 0).clamp(0, 1).numpy() * 255).round().astype(np.uint8))


def run_steps(files, listener=None, **settings) -> tuple[list, object]:
    """Every StepEvent of a real generation (64x64 unless `settings` say otherwise), and its result."""
    events = []

    def on_step(event):
        events.append(event)
        if listener is not None:
            listener(event)

    params = GenerationParams(**{"prompt": DEMO_PROMPT, "width": 64, "height": 64, **settings})
    result = AnimaPipeline(files).generate(params, on_step=on_step)
    return events, result


@pytest.fixture(scope="module")
def demo_files():
    return from_model_dir(demo_model_dir())


@pytest.fixture(scope="module")
def demo_x0(demo_files, one_thread) -> np.ndarray:
    """Every step's x0 of real demo-model runs of pictures with different backgrounds."""
    prompts = [DEMO_PROMPT, "a yellow triangle on a black background, center",
               "a white square on a green background, bottom right"]
    runs = [run_steps(demo_files, prompt=prompt, steps=8)[0] for prompt in prompts]
    return np.concatenate([event.x0 for events in runs for event in events])


# ---- the published Wan 2.1 factors ------------------------------------------------------------------------


def wan21_colour(latent: dict[int, float]) -> tuple[int, ...]:
    """The preview colour of a one-pixel latent with the given channels set, computed by hand from ComfyUI's
    Wan21 factors: rgb = (x . W + b + 1) / 2 in [0, 1], as 8-bit."""
    factors = [(-0.1299, -0.1692, 0.2932), (0.0671, 0.0406, 0.0442), (0.3568, 0.2548, 0.1747)]
    bias = (-0.1835, -0.0868, -0.3360)
    rgb = [bias[c] + sum(value * factors[channel][c] for channel, value in latent.items()) for c in range(3)]
    return tuple(round(255 * min(1.0, max(0.0, (v + 1) / 2))) for v in rgb)


@pytest.mark.parametrize("channels", [{}, {2: 1.0}, {0: -1.0, 1: 0.5}, {2: 20.0}, {2: -20.0}])
def test_published_wan21_projection_gives_the_expected_colour(channels):
    x0 = np.zeros((1, 16, 1, 1), dtype=np.float32)
    for channel, value in channels.items():
        x0[0, channel] = value
    image = published_wan21().to_image(x0)
    assert image.size == (1, 1) and image.getpixel((0, 0)) == wan21_colour(channels)


def test_projection_upscales_bilinear_and_shows_nan_black():
    x0 = np.zeros((1, 16, 2, 3), dtype=np.float32)
    x0[0, 2, 0, 0] = 20.0  # one saturated corner
    x0[0, :, 1, 2] = np.nan
    projection = published_wan21()
    small, big = projection.to_image(x0), projection.to_image(x0, upscale=8)
    colours = [len(np.unique(np.asarray(image).reshape(-1, 3), axis=0)) for image in (small, big)]
    assert big.size == (24, 16) and colours[1] > colours[0]  # bilinear ramps, not nearest-neighbour blocks
    assert small.getpixel((2, 1)) == (0, 0, 0) and small.getpixel((0, 0)) == wan21_colour({2: 20.0})
    assert big.getpixel((0, 0)) == small.getpixel((0, 0))  # the corner pixel keeps its colour


def test_projection_refuses_a_latent_of_other_channels():
    with pytest.raises(AnimaError, match=r"latent \[batch, 16, h, w\], got \[1, 4, 8, 8\]"):
        published_wan21().to_image(np.zeros((1, 4, 8, 8), dtype=np.float32))
    with pytest.raises(AnimaError, match="a latent projection is a"):
        LatentProjection(np.zeros((16, 4)), np.zeros(3))


def header_only_vae(path: Path, config: WanVAEConfig) -> Path:
    """A full-size VAE file whose weights are a sparse hole: enough for every header-only reader."""
    header, offset = {}, 0
    for name, shape in file_shapes(config).items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    write(path, header)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size + offset)
    return path


def test_the_real_vae_gets_the_published_factors_and_others_a_fit(tmp_path, tiny_set):
    real = header_only_vae(tmp_path / "qwen_image_vae.safetensors", WanVAEConfig())
    assert np.array_equal(projection_for(real).matrix, published_wan21().matrix)
    copy = tmp_path / "tiny.safetensors"
    shutil.copy(tiny_set.vae, copy)  # no stored file beside it: fitted on the spot, as make-tiny fitted it
    # The same fit up to the last bits of the VAE's decodes (torch's reductions follow its thread count).
    np.testing.assert_allclose(projection_for(copy).matrix,
                               read_projection(preview_file(tiny_set.vae), tiny_set.vae).matrix, rtol=1e-4, atol=1e-7)


# ---- fitting ------------------------------------------------------------------------------------------------


def test_fitted_projection_is_close_to_the_vae_decode(demo_files, demo_x0):
    """On a trained VAE (the demo model's), the projection fitted to its decodes of varied pictures previews real
    runs' x0 better than the best single colour, and far better than another VAE's factors."""
    vae = load_vae(demo_files.vae, decode_only=False)
    projection = fit_projection(vae, fit_latents(vae))
    x0 = demo_x0
    with torch.no_grad():
        decoded = [vae_image(vae.decode(torch.from_numpy(x0[i : i + 1]))) for i in range(len(x0))]
    mean_colour = np.mean([np.asarray(image, np.float64) for image in decoded], axis=(0, 1, 2)) / 255
    baselines = {"fitted": projection, "one colour": LatentProjection(np.zeros((16, 3)), mean_colour),
                 "Wan 2.1 factors": published_wan21()}
    scores = {name: np.mean([psnr(image, p.to_image(x0[i : i + 1], 8)) for i, image in enumerate(decoded)])
              for name, p in baselines.items()}
    # Measured: 13.5 dB, against 11.3 for the runs' mean colour and 9.0 for the Wan 2.1 factors.
    assert scores["fitted"] > 12.5, scores
    assert scores["fitted"] > scores["one colour"] + 1.5 and scores["fitted"] > scores["Wan 2.1 factors"] + 3.0, scores


def test_the_shipped_demo_projection_is_what_train_demo_stores(demo_files, tmp_path):
    copy = tmp_path / demo_files.vae.name
    shutil.copy(demo_files.vae, copy)
    config = DemoConfig.from_json(read_metadata(copy, "VAE")[META_PREFIX + "config"])
    rebuilt = json.loads(store_preview_projection(copy, config).read_text())
    shipped = json.loads(preview_file(demo_files.vae).read_text())
    assert {k: v for k, v in rebuilt.items() if k not in ("matrix", "bias")} == {
        k: v for k, v in shipped.items() if k not in ("matrix", "bias")}
    for key in ("matrix", "bias"):  # equal up to the last bits of the decodes, which follow torch's thread count
        np.testing.assert_allclose(rebuilt[key], shipped[key], rtol=1e-4, atol=1e-7)


def test_make_tiny_stores_the_fitted_projection(tiny_set):
    stored = read_projection(preview_file(tiny_set.vae), tiny_set.vae)
    fitted = fit_file(tiny_set.vae)
    # Equal up to the last bits of the decodes, which follow torch's thread count.
    np.testing.assert_allclose(stored.matrix, fitted.matrix, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(stored.bias, fitted.bias, rtol=1e-4, atol=1e-7)


def test_a_vae_file_without_encoder_is_fitted_on_noise(tmp_path, tiny_set):
    decoder_only = tmp_path / "decoder.safetensors"
    tensors = load_file(tiny_set.vae)
    save_file({k: v for k, v in tensors.items() if not k.startswith(("encoder.", "conv1."))}, decoder_only)
    projection = projection_for(decoder_only)
    assert projection.channels == 16 and np.isfinite(projection.matrix).all()
    assert not np.array_equal(projection.matrix, fit_file(tiny_set.vae).matrix)  # not the encodings' fit


# ---- the stored file --------------------------------------------------------------------------------------


def test_stored_projection_round_trips(tmp_path, tiny_set):
    vae = tmp_path / "vae.safetensors"
    shutil.copy(tiny_set.vae, vae)
    projection = LatentProjection(np.random.default_rng(0).normal(size=(16, 3)), [0.1, 0.5, 0.9])
    path = write_projection(projection, vae)
    assert path == tmp_path / "vae.preview.json" and json.loads(path.read_text())["format"] == PREVIEW_FORMAT
    back = read_projection(path, vae)
    assert np.array_equal(back.matrix, projection.matrix) and np.array_equal(back.bias, projection.bias)
    assert back.matrix.dtype == back.bias.dtype == np.float32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vae.preview.json", "vae.safetensors"]


def good_record(vae: Path) -> dict:
    return json.loads(write_projection(published_wan21(), vae).read_text())


def replaced(**changes):
    return lambda record: {**record, **changes}


def without(key):
    return lambda record: {k: v for k, v in record.items() if k != key}


def matrix_cell(value):
    def change(record):
        record["matrix"][3][1] = value
        return record
    return change


BAD_FILES = [
    ("not JSON", b"{\"format\": ", "is not a JSON preview projection"),
    ("not UTF-8", b"\xff\xfe{}", "is not a JSON preview projection"),
    ("nested too deep", b"[" * 50_000, "is not a JSON preview projection"),
    ("too large", b" " * (MAX_PREVIEW_BYTES + 1), "is not a JSON preview projection: larger than 64 KiB"),
    ("a list", [], "a JSON object with exactly the keys bias, format, matrix, vae_fingerprint"),
    ("missing bias", without("bias"), "exactly the keys"),
    ("an extra key", replaced(extra=1), "exactly the keys"),
    ("another format", replaced(format="anima-rknn-preview/2"), "format 'anima-rknn-preview/2' is not"),
    ("NaN", matrix_cell(math.nan), "each finite and at most 1000 in size"),
    ("infinity", matrix_cell(math.inf), "each finite"),
    ("1e999", lambda r: json.dumps({**r, "bias": ["X", 0.5, 0.5]}).replace('"X"', "1e999"), "each finite"),
    ("huge integer", matrix_cell(10**4000), "each finite and at most 1000"),
    ("too large a factor", matrix_cell(1e6), "each finite and at most 1000"),
    ("a string number", matrix_cell("0.5"), "matrix must be 16 rows of 3 numbers"),
    ("a boolean", matrix_cell(True), "matrix must be 16 rows of 3 numbers"),
    ("a null", matrix_cell(None), "matrix must be 16 rows of 3 numbers"),
    ("15 rows", lambda r: {**r, "matrix": r["matrix"][:15]}, "matrix must be 16 rows"),
    ("a row of 4", lambda r: {**r, "matrix": [row + [0.0] for row in r["matrix"]]}, "matrix must be 16 rows"),
    ("matrix not a list", replaced(matrix={"0": [0, 0, 0]}), "matrix must be 16 rows"),
    ("bias of 2", replaced(bias=[0.1, 0.2]), "bias 3 numbers"),
    ("another VAE's", replaced(vae_fingerprint="0" * 64), "was fitted for another VAE file than vae.safetensors"),
    ("a fingerprint not text", replaced(vae_fingerprint=7), "was fitted for another VAE file"),
]


@pytest.mark.parametrize(("case", "content", "message"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_a_bad_preview_file_is_refused_in_one_line(tmp_path, tiny_set, case, content, message):
    vae = tmp_path / "vae.safetensors"
    shutil.copy(tiny_set.vae, vae)
    path = preview_file(vae)
    if callable(content):
        content = content(good_record(vae))
    if not isinstance(content, bytes):
        content = (content if isinstance(content, str) else json.dumps(content)).encode()
    path.write_bytes(content)
    for read in (lambda: read_projection(path, vae), lambda: projection_for(vae),
                 lambda: PreviewWriter(tmp_path / "p.png", vae)):
        with pytest.raises(AnimaError, match=message) as refused:
            read()
        assert "\n" not in str(refused.value) and str(path) in str(refused.value)


def test_a_folder_or_a_re_saved_vae_is_refused(tmp_path, tiny_set):
    vae = tmp_path / "vae.safetensors"
    save_vae(load_vae(tiny_set.vae, decode_only=False), vae)  # same weights, a new file: a new fingerprint
    shutil.copy(preview_file(tiny_set.vae), preview_file(vae))
    with pytest.raises(AnimaError, match="was fitted for another VAE file"):
        projection_for(vae)
    preview_file(vae).unlink()
    preview_file(vae).mkdir()
    with pytest.raises(AnimaError, match="not a regular file"):
        projection_for(vae)


# ---- the step listener ------------------------------------------------------------------------------------


def test_writer_replaces_its_file_every_n_steps_and_at_the_last(tmp_path, tiny_set, one_thread):
    folder = tmp_path / "previews"
    folder.mkdir()
    path = folder / "live.png"
    writer = PreviewWriter(path, tiny_set.vae, every=3)
    seen = []  # after each step: (inode, bytes) of the preview, and the folder's names

    def look(event):
        stat = path.stat() if path.exists() else None
        seen.append((stat and stat.st_ino, path.read_bytes() if stat else None, sorted(os.listdir(folder))))

    events, _ = run_steps(tiny_set, lambda e: (writer(e), look(e)), steps=7)
    changed = [i + 1 for i in range(7) if seen[i][1] != (seen[i - 1][1] if i else None)]
    assert changed == [3, 6, 7]
    assert [names for *_, names in seen] == [[]] * 2 + [["live.png"]] * 5  # never a temporary beside it
    assert seen[2][0] != seen[5][0] != seen[6][0]  # each a new file moved into place, not rewritten in place
    projection = read_projection(preview_file(tiny_set.vae), tiny_set.vae)
    for step in changed:
        shown = Image.open(io.BytesIO(seen[step - 1][1]))
        assert shown.size == (64, 64)  # 8x8 latent, upscaled 8x (at most the VAE's own factor)
        assert np.array_equal(np.asarray(shown), np.asarray(projection.to_image(events[step - 1].x0, 8)))
    assert writer.seconds > 0


def test_a_reader_polling_the_preview_never_sees_half_a_file(tmp_path, tiny_set, one_thread):
    path = tmp_path / "live.png"
    writer = PreviewWriter(path, tiny_set.vae, vae_decode=True)
    done, reads, broken = threading.Event(), [], []

    def poll():
        while not done.is_set():
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            try:
                Image.open(io.BytesIO(data)).load()
                reads.append(len(data))
            except Exception as e:  # a torn read
                broken.append(repr(e))

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        run_steps(tiny_set, writer, steps=6, width=128, height=128)
    finally:
        done.set()
        reader.join()
    assert reads and not broken
    assert [p.name for p in tmp_path.iterdir() if is_temporary(p)] == []


def test_vae_decode_preview_is_the_vae_decode(tmp_path, tiny_set, one_thread):
    path = tmp_path / "live.png"
    writer = PreviewWriter(path, tiny_set.vae, every=100, vae_decode=True)
    events, result = run_steps(tiny_set, writer, steps=3)
    vae = load_vae(tiny_set.vae)
    with torch.no_grad():
        expected = vae_image(vae.decode(torch.from_numpy(events[-1].x0)))
    shown = Image.open(path)
    assert shown.size == (64, 64) and np.array_equal(np.asarray(shown), np.asarray(expected))
    # At the last step x0 is the final latent: the preview is the image itself.
    assert np.abs(np.asarray(shown, np.int16) - np.asarray(result.image, np.int16)).max() <= 1


def test_vae_decode_preview_of_a_large_image_is_tiled(tmp_path, tiny_set, one_thread):
    path = tmp_path / "live.png"
    events, _ = run_steps(tiny_set, PreviewWriter(path, tiny_set.vae, vae_decode=True, tile=64), steps=1,
                          width=128, height=128)
    vae = load_vae(tiny_set.vae)
    with torch.no_grad():
        tiled = vae_image(decode_tiled(vae, torch.from_numpy(events[0].x0), 64, 32))
        whole = vae_image(vae.decode(torch.from_numpy(events[0].x0)))
    assert np.array_equal(np.asarray(Image.open(path)), np.asarray(tiled))
    assert not np.array_equal(np.asarray(tiled), np.asarray(whole))  # tiles, blended: not the one-piece decode


@pytest.mark.parametrize(("settings", "message"), [
    ({"every": 0}, "preview interval must be a whole number of steps >= 1, got 0"),
    ({"every": 2.5}, "got 2.5"),
    ({"every": True}, "got True"),
    ({"tile": 60}, "preview VAE tile must be a multiple of 8 pixels >= 64, got 60"),
    ({"tile": 100}, "got 100"),
])
def test_writer_settings_are_checked(tmp_path, tiny_set, settings, message):
    with pytest.raises(AnimaError, match=message):
        PreviewWriter(tmp_path / "p.png", tiny_set.vae, **settings)
