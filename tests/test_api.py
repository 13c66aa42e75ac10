"""The small public API the README documents."""

import subprocess
import sys

import pytest
import torch

import anima_rknn


def test_load_dit_is_called_with_x_sigma_context(tiny_set):
    dit = anima_rknn.load_dit(tiny_set.dit)
    x = torch.randn(1, 16, 8, 8)
    v = dit(x, torch.tensor([0.7]), torch.zeros(1, 512, dit.config.context_dim))
    assert v.shape == x.shape and torch.isfinite(v).all()


def test_pipeline_from_a_model_directory(tiny_set):
    files = anima_rknn.resolve_model(tiny_set.dit.parents[2])
    result = anima_rknn.AnimaPipeline(files).generate(
        anima_rknn.GenerationParams(prompt="cat", width=64, height=64, steps=2))
    assert result.image.size == (64, 64) and result.finite


def test_img2img_from_the_public_api(tiny_set, tmp_path):
    from PIL import Image

    Image.new("RGB", (80, 48), (200, 40, 40)).save(tmp_path / "in.png")
    files = anima_rknn.resolve_model(tiny_set.dit.parents[2])
    params = anima_rknn.GenerationParams(prompt="cat", steps=4, strength=0.5, width=80, height=48,
                                         init_image=anima_rknn.ImageInput.from_path(tmp_path / "in.png"))
    result = anima_rknn.AnimaPipeline(files).generate(params)
    assert result.image.size == (80, 48) and result.summary(None)["passes"][0]["steps_run"] == 2


def test_spectrum_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; from anima_rknn import Spectrum; "
            "s = Spectrum(20); print(s.should_skip())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("call, pattern", [
    (lambda files: anima_rknn.AnimaPipeline("models/anima"), "takes the ModelFiles"),
    (lambda files: anima_rknn.AnimaPipeline(files).generate("a cat"), "takes a RunPlan .* or a GenerationParams"),
    (lambda files: anima_rknn.GenerationParams(prompt=None).validate(), "prompt must be text"),
    (lambda files: anima_rknn.GenerationParams(prompt="x", steps="20").validate(), "steps must be an integer"),
    (lambda files: anima_rknn.GenerationParams(prompt="x", cfg=float("nan")).validate(), "cfg must be a finite"),
    (lambda files: anima_rknn.GenerationParams(prompt="x", backend=3).validate(), "unknown backend"),
    (lambda files: anima_rknn.GenerationParams(prompt="x", cache="spectrum",
                                               cache_options={"w": "high"}).validate(), "w must be in"),
    (lambda files: anima_rknn.GenerationParams(prompt="x", cache_options=[1]).validate(), "must be a dict"),
])
def test_the_public_api_raises_anima_error_only(tiny_set, call, pattern):
    with pytest.raises(anima_rknn.AnimaError, match=pattern):
        call(tiny_set)


def test_random_seed_is_drawn_once_and_kept():
    params = anima_rknn.GenerationParams(prompt="x", seed=-1)
    assert 0 <= params.seed < 2**64 and params.seed != -1
    params.validate()
