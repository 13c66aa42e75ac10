"""`generate --preview`: the picture forming, as a user watches it."""

from __future__ import annotations

import shutil

import numpy as np
from PIL import Image

from anima_rknn.cli.generate import preview_listener
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import SAMPLERS
from anima_rknn.sampling.schedule import flow_sigmas

FAST = ("-W", "64", "-H", "64", "--steps", "6")


def test_preview_is_written_beside_the_image(run_cli, model_dir, tmp_path):
    out, preview = tmp_path / "x.png", tmp_path / "live.png"
    result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-o", out, "--preview", preview,
                     "--preview-every", "2")
    assert result.code == 0, result.err
    assert Image.open(preview).size[0] >= 64 and Image.open(out).size == (64, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.png", "x.png"]  # no temporaries


def test_preview_vae_is_the_decode_of_the_last_x0(run_cli, model_dir, tmp_path):
    out, preview = tmp_path / "x.png", tmp_path / "live.png"
    assert run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-o", out, "--preview", preview,
                   "--preview-vae").code == 0
    # The last step's x0 is the final latent (sigma 0), so its decode is the image itself, within rounding.
    diff = np.abs(np.asarray(Image.open(preview), dtype=int) - np.asarray(Image.open(out), dtype=int))
    assert diff.max() <= 1


def test_preview_path_is_checked_before_the_run(run_cli, model_dir, tmp_path):
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"mine")
    for preview, pattern in ((taken, "exists; pass --overwrite"), (tmp_path / "p.txt", "must be a .png"),
                             (tmp_path / "x.png", "another file than --out")):
        result = run_cli("generate", "--model", model_dir, "-p", "cat", *FAST, "-o", tmp_path / "x.png",
                         "--preview", preview)
        assert result.code == 1 and pattern in result.err and "Traceback" not in result.err
    assert taken.read_bytes() == b"mine" and sorted(p.name for p in tmp_path.iterdir()) == ["taken.png"]


def test_a_failing_preview_warns_once_and_the_run_goes_on(tiny_set, tmp_path, capsys):
    folder = tmp_path / "previews"
    folder.mkdir()
    listener = preview_listener(str(folder / "p.png"), tmp_path / "x.png", tiny_set.vae, 1, False, 512, False)
    shutil.rmtree(folder)  # the folder goes away mid-run

    def denoise(x, sigma):
        return np.zeros_like(x)

    result = sample(SAMPLERS["euler"], denoise, np.ones((1, 16, 8, 8), np.float32), flow_sigmas(4), make_cache("none", 4),
                          callback=listener)
    assert result.finite and result.model_calls == 4
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "previews stopped" in warnings[0]
