"""Live previews: what one costs per step, how close the latent projection is to the VAE, and the README strip.

--cost: one preview (projection + atomic PNG write, and the VAE-decode preview) at 512x512 and 1024x1024 against
one CPU step of the mid model (2 DiT passes with CFG, split torch engine), all in this one process.
--psnr: PSNR of the projection (upscaled 8x, bilinear) against the VAE decode of the same x0: the demo model on
x0 of real demo runs, and a full-size random-weight Wan VAE with its fitted projection on held-out latents.
--strip FILE: the demo model's previews at a few steps beside the final image (docs/preview_strip.png).

    .venv/bin/python benchmarks/preview.py --cost --psnr --strip docs/preview_strip.png
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from anima_rknn.bench.metrics import psnr
from anima_rknn.core.files import save_png
from anima_rknn.demo import demo_model_dir
from anima_rknn.demo.tiny_set import write_model_set
from anima_rknn.engine import make_engine
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.io import load_dit
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.sampling.sample import StepEvent
from anima_rknn.vae import WanVAEConfig, load_vae, random_vae
from anima_rknn.vae.preview import (
    LatentProjection,
    PreviewWriter,
    fit_file,
    fit_latents,
    fit_projection,
    projection_for,
    varied_images,
)

STRIP_PROMPT = "a red circle on a blue background, top left"
STRIP_STEPS = (1, 3, 6, 10, 15, 20)
DEMO_PROMPTS = (STRIP_PROMPT, "a yellow triangle on a black background, center",
                "a white square on a green background, bottom right",
                "a purple circle on an orange background, top right")
PANEL, LABEL = 128, 18  # pixels: panel side, label band height


def median_seconds(run, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_event(x0: np.ndarray) -> StepEvent:
    """The last step of a run (a preview is written), with `x0` as its estimate."""
    return StepEvent(1, 1, 1.0, 0.0, x0, x0, True, False, 0.0, 0.0, {})


def cost(mid: Path, repeats: int) -> None:
    if not (mid / "split_files").is_dir():
        print(f"writing the mid model set to {mid} (anima-rknn make-tiny --preset mid --out {mid})")
        write_model_set(mid, "mid")
    files = from_model_dir(mid)
    dit = load_dit(files.dit)
    config = dit.config
    generator = torch.Generator().manual_seed(0)
    print(f"\nmid model ({config.blocks} blocks, hidden {config.hidden}), {torch.get_num_threads()} threads, "
          f"median of {repeats}\n")
    print("| image | one CFG step (2 DiT passes) | projection preview | share of a step | VAE-decode preview "
          "| share of a step |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for side in (512, 1024):
            x = torch.randn((1, config.in_channels, side // 8, side // 8), generator=generator)
            cond, uncond = (torch.randn((1, config.context_tokens, config.context_dim), generator=generator)
                            for _ in range(2))
            engine = make_engine(dit, width=side, height=side)
            sigmas = iter(torch.linspace(1, 0.01, 1000).tolist())  # a new sigma each step, as in sampling

            def step() -> None:
                sigma = next(sigmas)
                with torch.inference_mode():
                    engine.velocity(x, sigma, cond)
                    engine.velocity(x, sigma, uncond)

            event = step_event(x.numpy())
            projection = PreviewWriter(Path(tmp) / "p.png", files.vae)
            decoded = PreviewWriter(Path(tmp) / "v.png", files.vae, vae_decode=True)
            step_s = median_seconds(step, repeats)
            projection_s = median_seconds(lambda: projection(event), 5 * repeats)
            decoded_s = median_seconds(lambda: decoded(event), repeats)
            print(f"| {side}x{side} | {step_s:.2f} s | {projection_s * 1000:.1f} ms | {projection_s / step_s:.2%} "
                  f"| {decoded_s:.2f} s | {decoded_s / step_s:.0%} |")
            engine.close()


def demo_x0() -> np.ndarray:
    """x0 of every step of 20-step demo runs of DEMO_PROMPTS: [prompts * 20, 16, 8, 8]."""
    pipeline = AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)
    found = []
    for prompt in DEMO_PROMPTS:
        pipeline.generate(GenerationParams(prompt=prompt, width=64, height=64, steps=20),
                          on_step=lambda event: found.append(event.x0.copy()))
    return np.concatenate(found)


def scores(vae, latents: np.ndarray, projections: dict[str, LatentProjection]) -> dict[str, tuple[float, float]]:
    """(mean, min) PSNR in dB of each projection, upscaled to full size, against the VAE decode of each latent."""
    with torch.no_grad():
        decoded = [vae.decode(torch.from_numpy(latents[i : i + 1]))[0] for i in range(len(latents))]
    references = [(d.permute(1, 2, 0).clamp(0, 1).numpy() * 255).round().astype(np.uint8) for d in decoded]
    result = {}
    for name, projection in projections.items():
        values = [psnr(reference, projection.to_image(latents[i : i + 1], vae.scale_factor))
                  for i, reference in enumerate(references)]
        result[name] = (float(np.mean(values)), float(np.min(values)))
    return result


def closeness() -> None:
    demo = from_model_dir(demo_model_dir())
    x0 = demo_x0()
    vae = load_vae(demo.vae)
    last = x0.reshape(len(DEMO_PROMPTS), -1, *x0.shape[1:])[:, -1]
    projections = {"stored (fitted on the demo's pictures)": projection_for(demo.vae),
                   "fitted on varied pictures (the default fit)": fit_file(demo.vae)}
    every, final = scores(vae, x0, projections), scores(vae, last, projections)
    print(f"\nprojection vs VAE decode of the same x0, PSNR in dB (mean / worst), {len(DEMO_PROMPTS)} prompts\n")
    print("| VAE | projection | every step's x0 | last step's x0 |")
    print("|---|---|---:|---:|")
    for name in projections:
        print(f"| demo (dim 16, trained) | {name} | {every[name][0]:.1f} / {every[name][1]:.1f} "
              f"| {final[name][0]:.1f} / {final[name][1]:.1f} |")

    full = random_vae(WanVAEConfig(), seed=2)  # make-tiny --preset full's VAE, in float32
    started = time.perf_counter()
    projection = fit_projection(full, fit_latents(full))
    fit_s = time.perf_counter() - started
    held_out = fit_latents(full, varied_images(4, 128, seed=1), seed=1).numpy()  # other pictures, other noise
    clean, mixed = held_out[:4], held_out[4:]
    a, b = scores(full, clean, {"fit": projection})["fit"], scores(full, mixed, {"fit": projection})["fit"]
    print(f"| full size (dim 96), random weights | fitted ({fit_s:.0f} s) | encodings {a[0]:.1f} / {a[1]:.1f} "
          f"| half noise {b[0]:.1f} / {b[1]:.1f} |")


def label(image: Image.Image, text: str) -> Image.Image:
    panel = Image.new("RGB", (image.width, image.height + LABEL), "white")
    panel.paste(image, (0, LABEL))
    ImageDraw.Draw(panel).text((4, 3), text, fill="black")
    return panel


def enlarged(image: Image.Image) -> Image.Image:
    """PANEL pixels square, each pixel of the written preview a block (what the file holds, only bigger)."""
    return image.resize((PANEL, PANEL), Image.Resampling.NEAREST)


def strip(out: Path) -> None:
    """Top row: what `--preview` writes (projection); bottom row: `--preview-vae` (VAE decode). Last: the image."""
    files = from_model_dir(demo_model_dir())
    with tempfile.TemporaryDirectory() as tmp:
        shown: dict[int, tuple[Image.Image, Image.Image]] = {}
        projection = PreviewWriter(Path(tmp) / "p.png", files.vae)
        decoded = PreviewWriter(Path(tmp) / "v.png", files.vae, vae_decode=True)

        def keep(event: StepEvent) -> None:
            if event.step in STRIP_STEPS:
                projection(event)
                decoded(event)
                shown[event.step] = (Image.open(projection.path).copy(), Image.open(decoded.path).copy())

        result = AnimaPipeline(files).generate(GenerationParams(prompt=STRIP_PROMPT, width=64, height=64, steps=20),
                                               on_step=keep)
    rows = [[label(enlarged(shown[s][row]), f"step {s}" + ("" if row == 0 else ", VAE")) for s in STRIP_STEPS]
            for row in (0, 1)]
    rows[0].append(label(enlarged(result.image), "final image"))
    rows[1].append(Image.new("RGB", rows[0][-1].size, "white"))
    sheet = Image.new("RGB", (sum(p.width for p in rows[0]), 2 * (PANEL + LABEL)), "white")
    for y, row in enumerate(rows):
        for x, panel in enumerate(row):
            sheet.paste(panel, (x * PANEL, y * (PANEL + LABEL)))
    save_png(sheet, out, overwrite=True)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost", action="store_true")
    parser.add_argument("--psnr", action="store_true")
    parser.add_argument("--strip", type=Path, default=None, metavar="FILE")
    parser.add_argument("--mid", type=Path, default=Path("/tmp/mid"), help="mid model set (written if missing)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.strip:
        strip(args.strip)
    if args.cost:
        cost(args.mid, args.repeats)
    if args.psnr:
        closeness()


if __name__ == "__main__":
    main()
