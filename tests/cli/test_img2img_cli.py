"""Image to image through the CLI, as a user meets it: img2img, inpainting, outpainting and the hires fix with
`generate` (exit codes, files, sizes, the PNG's parameters, the summary line and the record), kept pixels, the
flags in every command's help, and a stopped run resumed bit-identically, refused when its image is not given
again."""

from __future__ import annotations

import hashlib
import json
import shlex
import signal

import numpy as np
import pytest
from PIL import Image
from tqdm import tqdm

import anima_rknn.cli.generate as generate_command
from anima_rknn.cli.options import parse_outpaint
from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import cli_flags, option, options


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


def _noise(width: int, height: int, seed: int) -> Image.Image:
    """Random pixels: an exact match of kept pixels cannot happen by chance."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _box_mask(width: int, height: int, box: tuple[int, int, int, int]) -> Image.Image:
    mask = Image.new("L", (width, height), 0)
    mask.paste(255, box)
    return mask


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pictures")
    _noise(64, 64, 1).save(folder / "init.png")
    _box_mask(64, 64, (0, 0, 32, 64)).save(folder / "mask.png")  # the left half repainted
    _noise(32, 32, 2).save(folder / "small.png")
    _box_mask(32, 32, (0, 0, 16, 32)).save(folder / "small-mask.png")
    _noise(32, 32, 3).save(folder / "other.png")
    _noise(72, 56, 4).save(folder / "odd.png")  # not a multiple of 16: worked at 64x48
    _box_mask(72, 56, (8, 8, 24, 24)).save(folder / "odd-mask.png")
    return folder


def _pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def _parameters(path) -> str:
    with Image.open(path) as image:
        return image.text["parameters"]


def _generate(run_cli, model_dir, out, *args):
    result = run_cli("generate", "--model", model_dir, "-p", "a red circle", "-o", out, "--json", *args)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    return json.loads(result.out), result.err.strip().splitlines()[-1]


def test_img2img_runs_the_truncated_schedule_at_the_image_s_size(run_cli, model_dir, pictures, tmp_path):
    out = tmp_path / "x.png"
    record, line = _generate(run_cli, model_dir, out, "--init-img", pictures / "init.png", "--strength", "0.5",
                             "--steps", "4")
    assert line.startswith(f"wrote {out}: 64x64, 2 of 4 steps (strength 0.5), cache none: computed 2/2 steps, ")
    assert "VAE encode" in line
    assert record["passes"] == [{**record["passes"][0], "width": 64, "height": 64, "steps": 4, "start": 2,
                                 "steps_run": 2}]
    assert record["computed_steps"] == [1, 2] and record["model_calls"] == 2 and record["image_size"] == [64, 64]
    sha256 = hashlib.sha256((pictures / "init.png").read_bytes()).hexdigest()
    assert record["init_image"] == {"name": str(pictures / "init.png"), "sha256": sha256}
    assert record["strength"] == 0.5 and record["timings"]["vae_encode_s"] > 0
    assert Image.open(out).size == (64, 64)
    parameters = _parameters(out)
    assert "Denoising strength: 0.5" in parameters and "Size: 64x64" in parameters
    assert "Mask blur" not in parameters and "Hires" not in parameters


def test_a_tiny_strength_runs_the_last_step(run_cli, model_dir, pictures, tmp_path):
    """20 steps at strength 0.01 run one step, as diffusers' get_timesteps (20 x 0.01 rounded up)."""
    record, line = _generate(run_cli, model_dir, tmp_path / "x.png", "-i", pictures / "small.png", "--strength",
                             "0.01", "--steps", "20")
    assert "32x32, 1 of 20 steps (strength 0.01)" in line and record["passes"][0]["steps_run"] == 1


def test_inpainting_keeps_the_pixels_outside_the_mask_exactly(run_cli, model_dir, pictures, tmp_path):
    out = tmp_path / "x.png"
    record, line = _generate(run_cli, model_dir, out, "--init-img", pictures / "init.png", "--mask",
                             pictures / "mask.png", "--steps", "4")
    assert "64x64, 3 of 4 steps (strength 0.75)" in line
    init, made = _pixels(pictures / "init.png"), _pixels(out)
    # The mask's edge is at x = 32, blurred by 4 px: from x = 48 on the picture is the init image's, exactly.
    np.testing.assert_array_equal(made[:, 48:], init[:, 48:])
    assert not np.array_equal(made[:, :24], init[:, :24])  # the masked half was repainted
    parameters = _parameters(out)
    assert "Denoising strength: 0.75" in parameters and "Mask blur: 4" in parameters
    assert "Masked content: original" in parameters
    assert record["mask"]["sha256"] == hashlib.sha256((pictures / "mask.png").read_bytes()).hexdigest()
    assert record["mask_blur"] == 4 and record["outpaint"] is None


def test_outpainting_grows_the_canvas_and_keeps_the_original_inside(run_cli, model_dir, pictures, tmp_path):
    out = tmp_path / "x.png"
    record, line = _generate(run_cli, model_dir, out, "--init-img", pictures / "init.png", "--outpaint", "16,0,16,0",
                             "--steps", "4")
    assert line.startswith(f"wrote {out}: 96x64, 3 of 4 steps (strength 0.75)")
    assert Image.open(out).size == (96, 64) and record["image_size"] == [96, 64] and record["width"] == 96
    # The original sits at x = 16..80; 16 px from either seam it is untouched.
    np.testing.assert_array_equal(_pixels(out)[:, 32:64], _pixels(pictures / "init.png")[:, 16:48])
    parameters = _parameters(out)
    assert "Outpaint: 16,0,16,0" in parameters and "Size: 96x64" in parameters and "Mask blur: 4" in parameters
    assert record["outpaint"] == [16, 0, 16, 0]


def test_outpaint_takes_four_sides_or_one_for_all():
    assert parse_outpaint("8") == (8, 8, 8, 8)
    assert parse_outpaint(" 1, 2,3 ,4") == (1, 2, 3, 4)
    for bad in ("a,b", "1,2", "", "1.5", "1,2,3,4,5"):
        with pytest.raises(AnimaError, match="--outpaint takes LEFT,TOP,RIGHT,BOTTOM"):
            parse_outpaint(bad)


def test_hires_fix_renders_then_refines_at_twice_the_size(run_cli, model_dir, tmp_path):
    out = tmp_path / "x.png"
    record, line = _generate(run_cli, model_dir, out, "-W", "64", "-H", "64", "--steps", "4", "--hires",
                             "--hires-scale", "2")
    assert line.startswith(f"wrote {out}: 128x128 (hires fix of 64x64), 4 steps + 3 of 4 hires steps (strength "
                           "0.75), cache none: computed 4/4 + 3/3 steps, ")
    assert Image.open(out).size == (128, 128) and record["image_size"] == [128, 128]
    assert [(p["width"], p["height"], p["steps"], p["start"], p["steps_run"]) for p in record["passes"]] == [
        (64, 64, 4, 0, 4), (128, 128, 4, 1, 3)]
    assert record["hires"] == {"width": 128, "height": 128, "steps": 4, "upscaler": "latent", "strength": 0.75,
                               "cache": "none"}
    assert record["transformer_passes"] == 2 * (4 + 3)
    parameters = _parameters(out)
    assert "Size: 64x64" in parameters and "Denoising strength: 0.75" in parameters
    assert "Hires upscale: 2.0" in parameters and "Hires upscaler: Latent" in parameters


def test_only_masked_inpainting_keeps_the_init_image_s_size(run_cli, model_dir, pictures, tmp_path):
    out = tmp_path / "x.png"
    record, line = _generate(run_cli, model_dir, out, "--init-img", pictures / "odd.png", "--mask",
                             pictures / "odd-mask.png", "--inpaint-area", "masked", "--steps", "4")
    assert f"wrote {out}: 72x56 (worked at 64x48), 3 of 4 steps" in line
    assert Image.open(out).size == (72, 56) and record["image_size"] == [72, 56]
    assert (record["width"], record["height"]) == (64, 48)  # the init image's size in multiples of 16
    init, made = _pixels(pictures / "odd.png"), _pixels(out)
    np.testing.assert_array_equal(made[:, 48:], init[:, 48:])  # far from the mask (x 8..24) and its blur
    np.testing.assert_array_equal(made[40:], init[40:])
    assert not np.array_equal(made[10:22, 10:22], init[10:22, 10:22])
    parameters = _parameters(out)
    assert "Inpaint area: Only masked" in parameters and "Masked area padding: 32" in parameters


# ---- stop and resume ------------------------------------------------------------------------------------------

def _stop_at(monkeypatch, step: int) -> None:
    """Ctrl-C once the progress bar has counted `step` steps (of every pass): a real SIGINT, at a known step."""

    class Bar(tqdm):
        def update(self, n=1):
            shown = super().update(n)
            if self.n == step:
                signal.raise_signal(signal.SIGINT)
            return shown

    monkeypatch.setattr(generate_command, "tqdm", Bar)


RESUMED = {  # the settings, the image files, where the run is stopped and the steps it makes
    "img2img": (("--steps", "6"), ("-i", "small.png"), 2, 5),
    "inpainting": (("--steps", "6", "--cache", "spectrum"), ("-i", "small.png", "--mask", "small-mask.png"), 3, 5),
    "hires, stopped in the first pass": (("-W", "32", "-H", "32", "--steps", "4", "--hires"), (), 2, 7),
    "hires, stopped in the hires pass": (("-W", "32", "-H", "32", "--steps", "4", "--hires", "--cache", "spectrum"),
                                         (), 5, 7),
}


@pytest.mark.parametrize("case", list(RESUMED))
def test_a_stopped_run_resumes_to_the_uninterrupted_image(run_cli, model_dir, pictures, tmp_path, monkeypatch, case):
    settings, files, stop, total = RESUMED[case]
    images = [arg if arg.startswith("-") else pictures / arg for arg in files]
    base = ("generate", "--model", model_dir, "-p", "a red circle", *settings, *images)
    reference = tmp_path / "reference.png"
    assert run_cli(*base, "-o", reference).code == 0
    out, state = tmp_path / "x.png", tmp_path / "x.png.state"
    _stop_at(monkeypatch, stop)
    stopped = run_cli(*base, "-o", out)
    monkeypatch.setattr(generate_command, "tqdm", tqdm)
    assert stopped.code == 128 + signal.SIGINT, stopped.err
    line = next(line for line in stopped.err.splitlines() if line.startswith(f"stopped after step {stop}/{total}; "))
    printed = shlex.split(line.split("; resume with: ", 1)[1])  # the command it tells the user, run verbatim below
    assert printed[:2] == ["anima-rknn", "generate"] and printed[-2:] == ["--resume", str(state)], line
    assert state.is_file() and not out.exists()
    if images:  # a state keeps its images by fingerprint: they are given again
        refused = run_cli("generate", "--model", model_dir, "--resume", state)
        assert refused.code == 1 and "pass it again with --init-img" in refused.err, refused.err
    resumed = run_cli(*printed[1:])
    assert resumed.code == 0, resumed.err
    assert _pixels(out).tobytes() == _pixels(reference).tobytes()
    assert _parameters(out) == _parameters(reference)
    assert not state.exists()


def test_resuming_names_the_image_the_state_was_made_from(run_cli, model_dir, pictures, tmp_path, monkeypatch):
    out, state = tmp_path / "x.png", tmp_path / "x.png.state"
    small, mask = pictures / "small.png", pictures / "small-mask.png"
    _stop_at(monkeypatch, 1)
    assert run_cli("generate", "--model", model_dir, "-p", "cat", "-i", small, "--mask", mask, "--steps", "4",
                   "-o", out).code == 128 + signal.SIGINT
    monkeypatch.setattr(generate_command, "tqdm", tqdm)
    short = hashlib.sha256(small.read_bytes()).hexdigest()[:12]

    def refused(*args) -> str:
        result = run_cli("generate", "--model", model_dir, "--resume", state, *args)
        lines = result.err.strip().splitlines()
        assert result.code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.err
        return lines[0]

    assert refused() == (f"error: {state} was made from the init image {small} (sha256 {short}): a state keeps only "
                         f"its fingerprint, so pass it again with --init-img {small}")
    assert f"differs from the init image {state} was made from, {small} (sha256 {short})" in refused(
        "--init-img", pictures / "other.png", "--mask", mask)
    assert "was made from the mask" in refused("--init-img", small)
    assert "--mask" in refused("--init-img", small, "--mask", small) and "differs" in refused(
        "--init-img", small, "--mask", small)
    assert state.is_file() and not out.exists()  # a refused resume costs nothing
    # A text-to-image state takes no image.
    _stop_at(monkeypatch, 1)
    plain = tmp_path / "plain.png"
    assert run_cli("generate", "--model", model_dir, "-p", "cat", "-W", "32", "-H", "32", "--steps", "4",
                   "-o", plain).code == 128 + signal.SIGINT
    monkeypatch.setattr(generate_command, "tqdm", tqdm)
    result = run_cli("generate", "--model", model_dir, "--resume", tmp_path / "plain.png.state", "-i", small)
    assert result.code == 1 and "was made without an init image: drop --init-img" in result.err


# ---- the flags --------------------------------------------------------------------------------------------------

IMAGE_TO_IMAGE = ("init_image", "strength", "resize_mode", "mask", "mask_blur", "invert_mask", "masked_content",
                  "inpaint_area", "inpaint_padding", "outpaint", "hires", "hires_scale", "hires_width",
                  "hires_height", "hires_steps", "hires_upscaler", "hires_subgraphs", "hires_cache")


@pytest.mark.parametrize("command", ["generate", "bench", "batch"])
def test_every_image_to_image_setting_is_a_flag_with_its_help(run_cli, command):
    assert set(IMAGE_TO_IMAGE) <= {name for name, _ in options()}
    result = run_cli(command, "--help")
    assert result.code == 0
    text = " ".join(result.out.split())
    for name in IMAGE_TO_IMAGE:
        assert cli_flags(name)[0] in text, name
        assert " ".join(option(name).help.split()[:2]) in text, name
    assert "-i, --init-img FILE" in text and "--outpaint L,T,R,B" in text and "--mask FILE" in text
