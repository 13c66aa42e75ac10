"""Image to image measured: img2img strength against prompt adherence and closeness to the init image,
inpainting's colour change and what it keeps outside the mask, outpainting, and the hires fix's passes.

On the demo model (64x64, trained: the prompts can be read back off the pictures by eval-demo's reader):

- **strength**: each case's init picture (a txt2img render of one prompt of eval-demo's set) is taken by img2img
  to a new prompt with the same background and position but another shape colour and shape type, at each
  --strengths; PSNR of the result to the init picture, the reader's adherence to the new prompt (all four
  attributes; the colour alone) and to the init prompt, and the VAE round trip of the init as PSNR's ceiling.
- **inpaint**: the init's shape recoloured inside a mask (the box around the shape the reader finds, grown by 3
  px), per masked content and strength: adherence to the recoloured prompt, the colour of the shape pixels inside
  the mask, and PSNR outside the mask of (a) the final picture against the init picture (exact by construction:
  A1111's overlay) and (b) the decode before that paste against the VAE round trip decode(encode(init)), the
  figure issue 23 asks >= 35 dB of, outside the blurred mask (what the paste keeps) and outside the drawn one.
- **hires**: txt2img at 64x64, then the hires fix to 128x128 (twice the size the model was trained at) with every
  upscaler at --hires-strengths; the time of each pass, the reader on the result shrunk back to 64 px, and a
  direct 128x128 txt2img for comparison.
- **outpaint**: the init canvas grown to 96x64 and 128x64 (the new area inpainted with the init prompt); whether
  the new area reads as the background colour or grows another shape.

On the mid random model (random weights: time and memory only) the hires fix --mid-size -> 2x with the latent and
Lanczos upscalers against a direct txt2img at 2x, each with its peak RSS (one pipeline that loads each model only
while its stage runs, as `generate` does).

    python benchmarks/image_to_image.py [--parts strength,inpaint,hires,outpaint,mid] [--out-dir docs]
                                        [--mid /tmp/anima-mid] [--mid-size 256] [--json RUN.json]
    python benchmarks/image_to_image.py --quick            # a minute or two, figures into /tmp
    python benchmarks/image_to_image.py --from-json RUN.json   # the tables again, nothing measured

Cases: the first --cases prompts of eval-demo's set (prompt_set seed 7) rendered with eval-demo's noise seeds
(1000 + i); each new prompt's colour and shape are drawn by numpy's generator of --target-seed from the colours and
shapes the init does not have; the img2img and inpainting runs use noise seeds 2000 + i. Nothing was tuned on them.
Fixed: euler, simple schedule, CFG 4, fp32 bodies, the torch VAE, --threads torch threads. Prints Markdown
tables with the CPU flags and the date, writes docs/image_to_image.png (the before/after strip),
docs/image_to_image_strength.png and docs/image_to_image_hires.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import io
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from anima_rknn.bench.metrics import psnr
from anima_rknn.core.memory import peak_rss, return_freed_memory
from anima_rknn.demo import dataset
from anima_rknn.demo.dataset import IMAGE_SIZE, ShapeSpec
from anima_rknn.demo.evaluate import _shape_mask, adherence, judge, prompt_set, read_image
from anima_rknn.generation.image_to_image import prepare_source
from anima_rknn.generation.images import ImageInput
from anima_rknn.generation.params import HIRES_UPSCALERS, MASKED_CONTENT, build
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.model_set import demo_model_dir, from_model_dir

MID_PROMPT = "a cute anime girl standing in a flower field, masterpiece, best quality"
MID_SEED = 20260812
INIT_SEED, RUN_SEED = 1000, 2000
MASK_GROW = 3  # pixels around the shape's bounding box
OUTPAINTS = {"96x64": (16, 0, 16, 0), "128x64": (32, 0, 32, 0)}
CAP_DB = 100.0  # identical (PSNR inf) counts as this in means


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text()
    return " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_bf16)\b", text)))) or "none of them"


def code_state() -> dict:
    def git(*command: str) -> str:
        return subprocess.run(["git", *command], check=False, capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "modified": git("status", "--porcelain", "--", "../anima_rknn")}


@dataclasses.dataclass
class Case:
    index: int
    init: ShapeSpec  # the init picture's prompt
    target: ShapeSpec  # img2img: another colour and shape, the same background and position
    recolour: ShapeSpec  # inpainting: the init's prompt with the target's colour
    init_seed: int
    seed: int


def make_cases(count: int, prompt_seed: int, target_seed: int) -> list[Case]:
    rng = np.random.default_rng(target_seed)
    cases = []
    for i, spec in enumerate(prompt_set(count, prompt_seed)):
        colours = [c for c in dataset.COLOURS if c not in (spec.colour, spec.background)]
        shapes = [s for s in dataset.SHAPES if s != spec.shape]
        colour, shape = str(rng.choice(colours)), str(rng.choice(shapes))
        cases.append(Case(i, spec, dataclasses.replace(spec, colour=colour, shape=shape),
                          dataclasses.replace(spec, colour=colour), INIT_SEED + i, RUN_SEED + i))
    return cases


def png_input(image: Image.Image, name: str) -> ImageInput:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return ImageInput.from_bytes(buffer.getvalue(), name)


def border_colour(pixels: np.ndarray) -> np.ndarray:
    """The background colour as the reader takes it: the median of the two-pixel border."""
    pixels = pixels.astype(np.float32)
    return np.median(np.concatenate([pixels[:2].reshape(-1, 3), pixels[-2:].reshape(-1, 3),
                                     pixels[:, :2].reshape(-1, 3), pixels[:, -2:].reshape(-1, 3)]), axis=0)


def shape_box_mask(pixels: np.ndarray, spec: ShapeSpec) -> tuple[Image.Image, bool]:
    """The box around the shape the reader finds, grown by MASK_GROW px, as an L mask (255 = repaint); where no
    shape is found, the box around where the prompt puts it (second value True)."""
    found = _shape_mask(pixels.astype(np.float32), border_colour(pixels))
    mask = np.zeros(pixels.shape[:2], np.uint8)
    if found.sum() >= 40:
        ys, xs = np.nonzero(found)
        box = (ys.min() - MASK_GROW, ys.max() + 1 + MASK_GROW, xs.min() - MASK_GROW, xs.max() + 1 + MASK_GROW)
        fallback = False
    else:
        (cx, cy), half = spec.centre, spec.half_size + MASK_GROW
        box = (round(cy - half), round(cy + half), round(cx - half), round(cx + half))
        fallback = True
    top, bottom, left, right = (max(0, v) for v in box)
    mask[top:bottom, left:right] = 255
    return Image.fromarray(mask), fallback


def shrink(image: Image.Image) -> np.ndarray:
    """A picture at the reader's 64x64 (area average)."""
    return np.asarray(image.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX))


def _capped(values: list[float]) -> list[float]:
    return [min(v, CAP_DB) for v in values]


def spread(values: list[float]) -> dict:
    capped = _capped(values)
    return {"mean": float(np.mean(capped)), "std": float(np.std(capped)), "min": float(min(values)),
            "max": float(max(values)), "all_inf": all(math.isinf(v) for v in values)}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a share k / n."""
    if n == 0:
        return float("nan"), float("nan")
    p, d = k / n, 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


class Runner:
    """One model set's pipeline; each run's wall and process CPU seconds and its peak RSS (optional)."""

    def __init__(self, model_dir: Path, keep_dit: bool, steps: int, cfg: float, native_size: int | None) -> None:
        self.pipeline = AnimaPipeline(from_model_dir(model_dir), keep_dit=keep_dit)
        self.base = {"steps": steps, "cfg": cfg, "dtype": "fp32", "vae_backend": "torch"}
        self.native_size = native_size

    def params(self, **values):
        return build(self.base | values, native_size=self.native_size)

    def generate(self, measure_rss: bool = False, **values) -> dict:
        params = self.params(**values)
        events: list[tuple[int, float, float]] = []  # (step of the whole run, process CPU time then, step's wall s)

        def on_step(event) -> None:
            events.append((event.step, time.process_time(), event.seconds))

        wall, cpu = time.perf_counter(), time.process_time()
        if measure_rss:
            with peak_rss() as peak:
                result = self.pipeline.generate(params, on_step)
        else:
            peak, result = None, self.pipeline.generate(params, on_step)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if result.image is None:
            raise RuntimeError(f"non-finite result for {values}")
        passes = result.denoised_passes()
        step_cpu, step_wall, first = [], [], 0
        for denoise_pass in params.passes():  # each pass's median step: CPU between step ends, and wall
            mine = events[first:first + denoise_pass.steps_run]
            first += denoise_pass.steps_run
            deltas = [b[1] - a[1] for a, b in zip(mine, mine[1:])]
            step_cpu.append(float(np.median(deltas)) if deltas else float("nan"))
            step_wall.append(float(np.median([e[2] for e in mine])))
        return {"result": result, "step_cpu_s": step_cpu, "step_wall_s": step_wall, "params": params,
                "image": result.image, "wall_s": wall, "cpu_s": cpu,
                "peak_rss_gib": None if peak is None or peak.bytes is None else peak.bytes / 2**30,
                "pass_s": [d.denoise_s for d in passes], "steps_run": [p.steps_run for p in params.passes()],
                "encode_s": result.conditioning.encode_s, "vae_encode_s": result.vae_encode_s,
                "decode_s": result.decode_s}


# ---- the demo model's parts --------------------------------------------------------------------------------------

def measure_strength(runner: Runner, cases: list[Case], inits: list[Image.Image], strengths: list[float],
                     bar: tqdm, keep: dict) -> dict:
    plan = runner.pipeline.prepare(runner.params(prompt="x")).decode
    round_trip = []
    for case, init in zip(cases, inits):
        latent, _ = runner.pipeline.encode_image(init, plan)
        round_trip.append(psnr(init, runner.pipeline.decode(latent, plan)[0]))
    rows = []
    for strength in strengths:
        images, psnrs, cpu, wall = [], [], [], []
        for case, init in zip(cases, inits):
            bar.set_postfix_str(f"strength {strength:g} case {case.index}")
            run = runner.generate(prompt=case.target.caption, seed=case.seed,
                                  init_image=png_input(init, f"init{case.index}.png"), strength=strength)
            images.append(np.asarray(run["image"]))
            psnrs.append(psnr(init, run["image"]))
            cpu.append(run["cpu_s"])
            wall.append(run["wall_s"])
            keep.setdefault("strength", {})[(case.index, strength)] = run["image"]
            bar.update()
        to_target = adherence(judge([c.target for c in cases], images))
        init_colour = sum(read_image(image).colour == c.init.colour for c, image in zip(cases, images))
        params = runner.params(prompt="x", init_image=png_input(inits[0], "init"), strength=strength)
        first = params.passes()[0]
        rows.append({"strength": strength, "steps_run": first.steps_run, "sigma": float(first.sigmas[0]),
                     "psnr": psnrs, "adherence": to_target["all"], "colour": to_target["colour"],
                     "shape": to_target["shape"], "init_colour": init_colour / len(cases),
                     "hits": int(round(to_target["all"] * len(cases))), "n": len(cases),
                     "cpu_s": float(np.mean(cpu)), "wall_s": float(np.mean(wall))})
    init_adherence = adherence(judge([c.init for c in cases], [np.asarray(i) for i in inits]))["all"]
    same_as_txt2img = None
    if 1.0 in strengths:  # strength 1 starts from the noise alone: the txt2img picture of the new prompt, exactly
        same_as_txt2img = 0
        for case in cases:
            bar.set_postfix_str(f"txt2img of the new prompt, case {case.index}")
            run = runner.generate(prompt=case.target.caption, seed=case.seed)
            same_as_txt2img += bool(np.array_equal(np.asarray(run["image"]),
                                                   np.asarray(keep["strength"][(case.index, 1.0)])))
            bar.update()
    return {"rows": rows, "round_trip": round_trip, "init_adherence": init_adherence,
            "same_as_txt2img": same_as_txt2img,
            "cases": [{"init": c.init.caption, "target": c.target.caption, "init_seed": c.init_seed,
                       "seed": c.seed} for c in cases]}


def measure_inpaint(runner: Runner, cases: list[Case], inits: list[Image.Image], contents: list[str],
                    strengths: list[float], bar: tqdm, keep: dict) -> dict:
    masks, fallbacks, round_trips = [], 0, []
    for case, init in zip(cases, inits):
        mask, fallback = shape_box_mask(np.asarray(init), case.init)
        masks.append(mask)
        fallbacks += fallback
    rows = []
    for content in contents:
        for strength in strengths:
            finals, outside_a, outside_b, outside_hard, inside_new, dist_new, dist_old = [], [], [], [], [], [], []
            as_init_recoloured, kept_share = 0, []
            for c, (case, init, mask) in enumerate(zip(cases, inits, masks)):
                bar.set_postfix_str(f"inpaint {content} {strength:g} case {case.index}")
                run = runner.generate(prompt=case.recolour.caption, seed=case.seed,
                                      init_image=png_input(init, f"init{case.index}.png"),
                                      mask=png_input(mask, f"mask{case.index}.png"), strength=strength,
                                      masked_content=content)
                params, pipeline = run["params"], runner.pipeline
                plan = pipeline.prepare(params).decode
                source = prepare_source(params)
                before_paste = np.asarray(pipeline.decode(run["result"].latent, plan)[0])
                if len(round_trips) <= c:  # decode(encode(original)): the same for every content and strength
                    latent, _ = pipeline.encode_image(source.original, plan)
                    round_trips.append(np.asarray(pipeline.decode(latent, plan)[0]))
                final, original = np.asarray(run["image"]), np.asarray(init)
                kept = np.asarray(source.paste_mask) == 0  # outside the blurred mask: what the paste keeps
                kept_share.append(float(kept.mean()))
                as_init_recoloured += read_image(final) == dataclasses.replace(read_image(original),
                                                                               colour=case.recolour.colour)
                outside = np.asarray(mask) == 0  # outside the mask as drawn
                outside_a.append(psnr(original[kept], final[kept]))
                outside_b.append(psnr(round_trips[c][kept], before_paste[kept]))
                outside_hard.append(psnr(round_trips[c][outside], before_paste[outside]))
                shape_px = _shape_mask(final.astype(np.float32), border_colour(original)) & ~outside
                if shape_px.sum():
                    median = np.median(final[shape_px].astype(np.float32), axis=0)
                    new, old = (np.array(dataset.COLOURS[n], np.float32) for n in (case.recolour.colour,
                                                                                     case.init.colour))
                    dist_new.append(float(np.linalg.norm(median - new)))
                    dist_old.append(float(np.linalg.norm(median - old)))
                    names = list(dataset.COLOURS)
                    nearest = names[int(np.argmin([np.linalg.norm(median - np.array(dataset.COLOURS[n]))
                                                   for n in names]))]
                    inside_new.append(nearest == case.recolour.colour)
                else:
                    inside_new.append(False)
                finals.append(final)
                keep.setdefault("inpaint", {})[(case.index, content, strength)] = (run["image"],
                                                                                   Image.fromarray(before_paste))
                bar.update()
            scores = adherence(judge([c.recolour for c in cases], finals))
            rows.append({"content": content, "strength": strength, "n": len(cases),
                         "adherence": scores["all"], "colour": scores["colour"],
                         "as_init_recoloured": as_init_recoloured, "kept_share": float(np.mean(kept_share)),
                         "new_colour_inside": int(sum(inside_new)), "shape_found": len(dist_new),
                         "dist_new": float(np.mean(dist_new)) if dist_new else float("nan"),
                         "dist_old": float(np.mean(dist_old)) if dist_old else float("nan"),
                         "final_vs_init": outside_a, "before_paste_vs_round_trip": outside_b,
                         "before_paste_vs_round_trip_drawn": outside_hard})
    keep["masks"] = masks
    mask_share = float(np.mean([(np.asarray(m) > 0).mean() for m in masks]))
    return {"rows": rows, "fallback_masks": fallbacks, "mask_share": mask_share,
            "cases": [c.recolour.caption for c in cases]}


def measure_hires(runner: Runner, cases: list[Case], inits: list[Image.Image], upscalers: list[str],
                  strengths: list[float], bar: tqdm, keep: dict) -> dict:
    rows, direct = [], []
    for case, init in zip(cases, inits):
        bar.set_postfix_str(f"direct 128 case {case.index}")
        run = runner.generate(prompt=case.init.caption, seed=case.init_seed, width=128, height=128)
        direct.append({"image": shrink(run["image"]), "cpu_s": run["cpu_s"], "wall_s": run["wall_s"],
                       "step_cpu_s": run["step_cpu_s"][0],
                       "pass_s": run["pass_s"][0], "decode_s": run["decode_s"]})
        keep.setdefault("hires", {})[(case.index, "direct")] = run["image"]
        bar.update()
    for upscaler in upscalers:
        for strength in strengths:
            runs = []
            for case, init in zip(cases, inits):
                bar.set_postfix_str(f"hires {upscaler} {strength:g} case {case.index}")
                run = runner.generate(prompt=case.init.caption, seed=case.init_seed, hires=True,
                                      hires_upscaler=upscaler, strength=strength)
                run["shrunk"] = shrink(run["image"])
                runs.append(run)
                keep["hires"][(case.index, upscaler, strength)] = run["image"]
                bar.update()
            scores = adherence(judge([c.init for c in cases], [r["shrunk"] for r in runs]))
            rows.append({"upscaler": upscaler, "strength": strength, "n": len(cases),
                         "steps_run": runs[0]["steps_run"],
                         "first_s": float(np.mean([r["pass_s"][0] for r in runs])),
                         "step_cpu_s": [float(np.mean([r["step_cpu_s"][i] for r in runs])) for i in (0, 1)],
                         "second_s": float(np.mean([r["pass_s"][1] for r in runs])),
                         "vae_encode_s": float(np.mean([r["vae_encode_s"] for r in runs])),
                         "decode_s": float(np.mean([r["decode_s"] for r in runs])),
                         "wall_s": float(np.mean([r["wall_s"] for r in runs])),
                         "cpu_s": float(np.mean([r["cpu_s"] for r in runs])),
                         "adherence": scores["all"], "shape": scores["shape"],
                         "psnr_to_first": [psnr(np.asarray(init), r["shrunk"]) for init, r in zip(inits, runs)]})
    direct_scores = adherence(judge([c.init for c in cases], [d["image"] for d in direct]))
    first_scores = adherence(judge([c.init for c in cases], [np.asarray(i) for i in inits]))
    return {"rows": rows, "n": len(cases), "first_adherence": first_scores["all"], "steps": runner.base["steps"],
            "direct": {"adherence": direct_scores["all"], "shape": direct_scores["shape"],
                       "pass_s": float(np.mean([d["pass_s"] for d in direct])),
                       "step_cpu_s": float(np.mean([d["step_cpu_s"] for d in direct])),
                       "decode_s": float(np.mean([d["decode_s"] for d in direct])),
                       "wall_s": float(np.mean([d["wall_s"] for d in direct])),
                       "cpu_s": float(np.mean([d["cpu_s"] for d in direct])),
                       "psnr_to_first": [psnr(np.asarray(i), d["image"]) for i, d in zip(inits, direct)]}}


def measure_outpaint(runner: Runner, cases: list[Case], inits: list[Image.Image], sizes: list[str],
                     bar: tqdm, keep: dict) -> dict:
    rows = []
    for size in sizes:
        left, top, right, bottom = OUTPAINTS[size]
        as_background, extra_shapes, distances, kept, exact = 0, 0, [], [], 0
        for case, init in zip(cases, inits):
            bar.set_postfix_str(f"outpaint {size} case {case.index}")
            run = runner.generate(prompt=case.init.caption, seed=case.seed,
                                  init_image=png_input(init, f"init{case.index}.png"), outpaint=(left, top, right,
                                                                                                 bottom))
            pixels = np.asarray(run["image"])
            new = np.ones(pixels.shape[:2], bool)
            new[top:top + IMAGE_SIZE, left:left + IMAGE_SIZE] = False
            original = pixels[top:top + IMAGE_SIZE, left:left + IMAGE_SIZE]
            kept.append(psnr(np.asarray(init), original))
            paste = np.asarray(prepare_source(run["params"]).paste_mask) == 0  # outside the blurred seam
            exact += bool(np.array_equal(pixels[paste], np.asarray(prepare_source(run["params"]).original)[paste]))
            background = border_colour(np.asarray(init))
            median = np.median(pixels[new].astype(np.float32), axis=0)
            distances.append(float(np.linalg.norm(median - np.array(dataset.COLOURS[case.init.background]))))
            names = list(dataset.COLOURS)
            nearest = names[int(np.argmin([np.linalg.norm(median - np.array(dataset.COLOURS[n])) for n in names]))]
            as_background += nearest == case.init.background
            extra_shapes += int((_shape_mask(pixels.astype(np.float32), background) & new).sum() >= 40)
            keep.setdefault("outpaint", {})[(case.index, size)] = run["image"]
            bar.update()
        rows.append({"size": size, "outpaint": OUTPAINTS[size], "n": len(cases), "as_background": as_background,
                     "extra_shapes": extra_shapes, "distance": float(np.mean(distances)), "kept": kept, "exact": exact})
    return {"rows": rows}


# ---- the mid model ----------------------------------------------------------------------------------------------

def measure_mid(args: argparse.Namespace, bar: tqdm) -> dict:
    if not (args.mid / "split_files").is_dir():
        cli = str(Path(sys.executable).with_name("anima-rknn"))
        subprocess.run([cli, "make-tiny", "--preset", "mid", "--out", str(args.mid)], check=True)
    runner = Runner(args.mid, False, args.mid_steps, args.cfg, None)
    size, big = args.mid_size, 2 * args.mid_size
    rows = []
    jobs = [("hires", u) for u in args.mid_upscalers] + ([("direct", None)] if args.mid_direct else [])
    for kind, upscaler in jobs:
        bar.set_postfix_str(f"mid {kind} {upscaler or ''}")
        if kind == "hires":
            run = runner.generate(True, prompt=MID_PROMPT, seed=MID_SEED, width=size, height=size, hires=True,
                                  hires_upscaler=upscaler, strength=args.mid_strength)
        else:
            run = runner.generate(True, prompt=MID_PROMPT, seed=MID_SEED, width=big, height=big)
        rows.append({"kind": kind, "upscaler": upscaler, "steps_run": run["steps_run"], "pass_s": run["pass_s"],
                     "encode_s": run["encode_s"], "vae_encode_s": run["vae_encode_s"], "decode_s": run["decode_s"],
                     "wall_s": run["wall_s"], "cpu_s": run["cpu_s"], "peak_rss_gib": run["peak_rss_gib"],
                     "step_cpu_s": run["step_cpu_s"]})
        bar.update()
    return {"size": size, "hires_size": big, "steps": args.mid_steps, "strength": args.mid_strength, "rows": rows}


# ---- tables -----------------------------------------------------------------------------------------------------

def _db(values: list[float]) -> str:
    s = spread(values)
    return "inf (identical)" if s["all_inf"] else f"{s['min']:.1f} / {s['mean']:.1f}"


def strength_table(m: dict) -> str:
    lines = ["| strength | steps run (of the schedule's) | first sigma | PSNR to init: mean ± sd (min..max), dB | "
             "adherence to the new prompt (95% interval) | new colour right | new shape right | init colour still "
             "read | s / run (wall, CPU) |", "|---|---|---|---|---|---|---|---|---|"]
    for row in m["rows"]:
        s = spread(row["psnr"])
        low, high = wilson(row["hits"], row["n"])
        lines.append(f"| {row['strength']:g} | {row['steps_run']} | {row['sigma']:.3f} | {s['mean']:.1f} ± "
                     f"{s['std']:.1f} ({s['min']:.1f}..{s['max']:.1f}) | {row['adherence']:.0%} ({low:.0%}-{high:.0%})"
                     f" | {row['colour']:.0%} | {row['shape']:.0%} | {row['init_colour']:.0%} | "
                     f"{row['wall_s']:.2f}, {row['cpu_s']:.2f} |")
    rt = spread(m["round_trip"])
    lines.append(f"\nVAE round trip of the init pictures (PSNR's ceiling as strength goes to 0): {rt['mean']:.1f} dB "
                 f"mean ({rt['min']:.1f}..{rt['max']:.1f}); the init pictures follow their own prompts: "
                 f"{m['init_adherence']:.0%}."
                 + ("" if m.get("same_as_txt2img") is None else
                    f" Strength 1 against a txt2img of the new prompt, same seed: {m['same_as_txt2img']}/"
                    f"{len(m['cases'])} pixel-identical."))
    return "\n".join(lines)


def inpaint_table(m: dict) -> str:
    lines = ["| masked content | strength | adherence to the recoloured prompt | colour right | reads as the init "
             "recoloured | new colour read "
             "inside the mask | shape colour's distance to the new / old colour (RGB) | (a) final vs init, outside "
             "the blurred mask | (b) before paste vs round trip, outside the blurred mask: min / mean dB | (b) "
             "outside the drawn mask: min / mean dB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in m["rows"]:
        lines.append(f"| {row['content']} | {row['strength']:g} | {row['adherence']:.0%} | {row['colour']:.0%} | "
                     f"{row['as_init_recoloured']}/{row['n']} | "
                     f"{row['new_colour_inside']}/{row['n']} | {row['dist_new']:.0f} / {row['dist_old']:.0f} | "
                     f"{_db(row['final_vs_init'])} | {_db(row['before_paste_vs_round_trip'])} | "
                     f"{_db(row['before_paste_vs_round_trip_drawn'])} |")
    every = [v for row in m["rows"] for v in row["before_paste_vs_round_trip"]]
    lines.append(f"\n(b) over every run above: min {min(every):.1f} dB, mean {spread(every)['mean']:.1f} dB "
                 f"({len(every)} runs). Masks cover {m['mask_share']:.0%} of the picture on average, "
                 f"{1 - m['rows'][0]['kept_share']:.0%} blurred (mask blur 4)"
                 + (f"; {m['fallback_masks']} fell back to the prompt's box (no shape found)"
                    if m["fallback_masks"] else "") + ".")
    return "\n".join(lines)


def hires_table(m: dict) -> str:
    lines = ["| upscaler | strength | steps run: first, hires | first pass (64x64) s | hires pass (128x128) s | "
             "CPU s a step: first, hires | VAE encode s | decode s | wall s / run (CPU) | adherence, shrunk to 64 px "
             "| shape right | PSNR to the first pass, shrunk: mean (min) dB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in m["rows"]:
        s = spread(row["psnr_to_first"])
        lines.append(f"| {row['upscaler']} | {row['strength']:g} | {row['steps_run'][0]}, {row['steps_run'][1]} | "
                     f"{row['first_s']:.2f} | {row['second_s']:.2f} | {row['step_cpu_s'][0]:.3f}, "
                     f"{row['step_cpu_s'][1]:.3f} | {row['vae_encode_s']:.2f} | "
                     f"{row['decode_s']:.2f} | {row['wall_s']:.2f} ({row['cpu_s']:.2f}) | {row['adherence']:.0%} | "
                     f"{row['shape']:.0%} | {s['mean']:.1f} ({s['min']:.1f}) |")
    d = m["direct"]
    s = spread(d["psnr_to_first"])
    lines.append(f"| direct txt2img 128x128 | - | -, {m['steps']} | - | {d['pass_s']:.2f} | -, "
                 f"{d['step_cpu_s']:.3f} | - | {d['decode_s']:.2f} | "
                 f"{d['wall_s']:.2f} ({d['cpu_s']:.2f}) | {d['adherence']:.0%} | {d['shape']:.0%} | "
                 f"{s['mean']:.1f} ({s['min']:.1f}) |")
    lines.append(f"\nThe first passes alone (the 64x64 txt2img pictures): adherence {m['first_adherence']:.0%} "
                 f"({m['n']} prompts).")
    return "\n".join(lines)


def outpaint_table(m: dict) -> str:
    lines = ["| canvas | grown by (L,T,R,B) | new area reads as the background colour | another shape in the new area "
             "| new area's median colour: distance to the background's (RGB) | init area: PSNR to the init, min / "
             "mean dB | outside the blurred seam: identical |", "|---|---|---|---|---|---|---|"]
    for row in m["rows"]:
        lines.append(f"| {row['size']} | {','.join(map(str, row['outpaint']))} | {row['as_background']}/{row['n']} | "
                     f"{row['extra_shapes']}/{row['n']} | {row['distance']:.0f} | {_db(row['kept'])} | "
                     f"{row['exact']}/{row['n']} |")
    return "\n".join(lines)


def mid_table(m: dict) -> str:
    size, big = m["size"], m["hires_size"]
    lines = [f"| run | steps run | first pass {size}x{size} s | {big}x{big} pass s | CPU s a step: {size}, {big} | "
             "VAE encode s | decode s | total wall s (CPU) | peak RSS |", "|---|---|---|---|---|---|---|---|---|"]
    for row in m["rows"]:
        rss = "n/a" if row["peak_rss_gib"] is None else f"{row['peak_rss_gib']:.2f} GiB"
        if row["kind"] == "hires":
            label = f"hires fix {size} -> {big}, {row['upscaler']}, strength {m['strength']:g}"
            first, second = f"{row['pass_s'][0]:.1f}", f"{row['pass_s'][1]:.1f}"
            steps = f"{row['steps_run'][0]} + {row['steps_run'][1]}"
            per_step = f"{row['step_cpu_s'][0]:.2f}, {row['step_cpu_s'][1]:.2f}"
        else:
            label, first, second, steps = f"direct txt2img {big}x{big}", "-", f"{row['pass_s'][0]:.1f}", \
                f"{row['steps_run'][0]}"
            per_step = f"-, {row['step_cpu_s'][0]:.2f}"
        lines.append(f"| {label} | {steps} | {first} | {second} | {per_step} | {row['vae_encode_s']:.1f} | "
                     f"{row['decode_s']:.1f} "
                     f"| {row['wall_s']:.1f} ({row['cpu_s']:.1f}) | {rss} |")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    settings, parts = report["settings"], report["parts"]
    out = [f"Measured {report['date']} on this machine (CPU flags {report['cpu_flags']}), {settings['threads']} "
           f"torch thread(s), commit {report['code']['commit']}"
           + (" with modified package files" if report["code"]["modified"] else "")
           + f"; euler, simple schedule, CFG {settings['cfg']:g}, fp32 bodies, torch VAE"
           + (f", demo model {settings['steps']} steps" if set(parts) - {"mid"} else "") + "; "
           f"{report['runtime_s'] / 60:.1f} min, {report['cpu_s'] / 60:.1f} min of process CPU time.", ""]
    if "strength" in parts:
        out += [f"#### img2img strength, demo model 64x64, {len(parts['strength']['cases'])} cases", "",
                strength_table(parts["strength"]), ""]
    if "inpaint" in parts:
        out += [f"#### inpainting a colour change, demo model, {parts['inpaint']['rows'][0]['n']} cases", "",
                inpaint_table(parts["inpaint"]), ""]
    if "hires" in parts:
        out += [f"#### hires fix 64 -> 128, demo model, {parts['hires']['n']} prompts (mean seconds per run)", "",
                hires_table(parts["hires"]), ""]
    if "outpaint" in parts:
        out += ["#### outpainting, demo model (masked content original, strength 0.75)", "",
                outpaint_table(parts["outpaint"]), ""]
    if "mid" in parts:
        m = parts["mid"]
        out += [f"#### hires fix on the mid random model, {m['size']} -> {m['hires_size']}, {m['steps']} steps "
                "(time and memory only)", "", mid_table(m), ""]
    return "\n".join(out)


# ---- figures ----------------------------------------------------------------------------------------------------

def plot_strength(m: dict, path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no display backend needed

    rows = m["rows"]
    x = [r["strength"] for r in rows]
    figure = Figure(figsize=(7.5, 4.6), dpi=110)
    left = figure.add_subplot(1, 1, 1)
    means = [spread(r["psnr"])["mean"] for r in rows]
    sds = [spread(r["psnr"])["std"] for r in rows]
    left.fill_between(x, [min(r["psnr"]) for r in rows], [max(r["psnr"]) for r in rows], color="C0", alpha=0.12,
                      label="PSNR min..max")
    left.errorbar(x, means, yerr=sds, fmt="o-", color="C0", capsize=3, label="PSNR to init, mean ± sd")
    left.axhline(float(np.mean(m["round_trip"])), color="C0", ls=":", lw=1,
                 label="VAE round trip of the init (ceiling)")
    left.set_xlabel("strength (share of the 20 steps run)")
    left.set_ylabel("PSNR to the init picture (dB)", color="C0")
    right = left.twinx()
    share = [r["adherence"] for r in rows]
    bounds = [wilson(r["hits"], r["n"]) for r in rows]
    right.fill_between(x, [b[0] for b in bounds], [b[1] for b in bounds], color="C3", alpha=0.12,
                       label="95% interval")
    right.plot(x, share, "s-", color="C3", label="adherence to the new prompt")
    right.plot(x, [r["colour"] for r in rows], "--", color="C3", lw=1, alpha=0.7, label="new colour right")
    right.plot(x, [r["init_colour"] for r in rows], ":", color="grey", lw=1.2, label="init colour still read")
    right.set_ylim(-0.03, 1.03)
    right.set_ylabel("share of cases (eval-demo's reader)", color="C3")
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    figure.legend(handles=handles, loc="lower center", ncol=3, fontsize=7.5, bbox_to_anchor=(0.5, 0.0))
    left.set_title(f"demo model img2img to a new colour and shape, {rows[0]['n']} cases", fontsize=10)
    left.grid(alpha=0.3)
    figure.tight_layout(rect=(0, 0.13, 1, 1))
    figure.savefig(path)


_FONT = None


def _font() -> ImageFont.ImageFont:
    global _FONT
    if _FONT is None:
        try:
            _FONT = ImageFont.load_default(size=15)
        except TypeError:  # Pillow < 10.1
            _FONT = ImageFont.load_default()
    return _FONT


def _tile(image: Image.Image, scale: int) -> Image.Image:
    return image.convert("RGB").resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)


def _strip(rows: list[tuple[str, list[tuple[Image.Image, str]], int]], path: Path) -> None:
    """Rows of (title, [(picture, label)], how many pictures are inputs): the title above, then the inputs, an
    arrow, the outputs, each with its label below."""
    gap, title_h, line_h, arrow_w = 12, 24, 19, 44
    heights = [title_h + max(p.height for p, _ in items) + 8 + line_h * max(label.count("\n") + 1 for _, label in items)
               + gap for _, items, _ in rows]
    widths = [gap + sum(p.width + gap for p, _ in items) + arrow_w * (0 < n < len(items)) for _, items, n in rows]
    sheet = Image.new("RGB", (max(widths), sum(heights) + gap), "white")
    draw, font = ImageDraw.Draw(sheet), _font()
    y = gap
    for (title, items, inputs), height in zip(rows, heights):
        draw.text((gap, y), title, fill="black", font=font)
        x, top = gap, y + title_h
        for n, (picture, label) in enumerate(items):
            if n == inputs and n:
                mid = top + picture.height // 2
                draw.line((x + 2, mid, x + arrow_w - 12, mid), fill="black", width=3)
                draw.polygon([(x + arrow_w - 6, mid), (x + arrow_w - 18, mid - 8), (x + arrow_w - 18, mid + 8)],
                             fill="black")
                x += arrow_w
            sheet.paste(picture, (x, top))
            draw.multiline_text((x, top + picture.height + 3), label, fill="black", font=font, spacing=2)
            x += picture.width + gap
        y += height
    sheet.save(path)


def _mask_overlay(init: Image.Image, mask: Image.Image) -> Image.Image:
    tinted = Image.blend(init.convert("RGB"), Image.new("RGB", init.size, "white"), 0.6)
    return Image.composite(tinted, init.convert("RGB"), mask)


def _short(caption: str) -> str:
    return caption.replace(" background", " bg").replace(", ", "\n")


def write_strip(report: dict, keep: dict, inits: list[Image.Image], cases: list[Case], path: Path) -> None:
    case, rows = cases[0], []
    init = inits[0]
    parts = report["parts"]
    if "strength" in parts:
        shown = [s for s in (0.3, 0.5, 0.7, 0.9) if (0, s) in keep["strength"]] or \
            sorted(s for (i, s) in keep["strength"] if i == 0)[-3:]
        rows.append((f"img2img to \"{case.target.caption}\"",
                     [(_tile(init, 4), "init\n" + _short(case.init.caption))]
                     + [(_tile(keep["strength"][(0, s)], 4), f"strength {s:g}") for s in shown], 1))
    if "inpaint" in parts:
        done = keep["inpaint"]
        contents = [c for c in MASKED_CONTENT if any(k[0] == 0 and k[1] == c for k in done)]
        strength = max(k[2] for k in done)
        rows.append((f"inpainting to \"{case.recolour.caption}\" (mask over the shape)",
                     [(_tile(init, 4), "init"), (_tile(_mask_overlay(init, keep["masks"][0]), 4), "mask (pale)")]
                     + [(_tile(done[(0, c, strength)][0], 4), f"{c.replace('_', ' ')}\nstrength {strength:g}")
                        for c in contents], 2))
    if "outpaint" in parts:
        rows.append(("outpainting (the init prompt)", [(_tile(init, 4), "init 64x64")]
                     + [(_tile(keep["outpaint"][(0, s)], 4), s) for s in OUTPAINTS if (0, s) in keep["outpaint"]],
                     1))
    if "hires" in parts:
        done = keep["hires"]
        picks = [k for k in ((0, "latent", 0.3), (0, "latent", 0.5), (0, "lanczos", 0.3)) if k in done] or \
            [k for k in done if k[0] == 0 and k[1] != "direct"][:2]
        rows.append(("hires fix 64 -> 128 (twice the size the demo model was trained at)",
                     [(_tile(init, 4), "first pass 64x64")]
                     + [(_tile(done[k], 2), f"{k[1]}, strength {k[2]:g}\n128x128") for k in picks], 1))
    _strip(rows, path)


def write_hires_grid(report: dict, keep: dict, inits: list[Image.Image], cases: list[Case], path: Path) -> None:
    done = keep["hires"]
    rows = [(f"\"{cases[0].init.caption}\": the first pass, and txt2img at 128x128 directly",
             [(_tile(inits[0], 4), "first pass 64x64"), (_tile(done[(0, "direct")], 2), "txt2img 128x128")], 0)]
    strengths = sorted({k[2] for k in done if k[0] == 0 and k[1] != "direct"})
    for upscaler in HIRES_UPSCALERS:
        if (0, upscaler, strengths[0]) in done:
            rows.append((f"hires fix, upscaler {upscaler}",
                         [(_tile(done[(0, upscaler, s)], 2), f"strength {s:g}") for s in strengths], 0))
    _strip(rows, path)


# ---- main -------------------------------------------------------------------------------------------------------

def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def _names(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="strength,inpaint,hires,outpaint,mid",
                        help="comma list of strength, inpaint, hires, outpaint, mid")
    parser.add_argument("--cases", type=int, default=8, help="demo model: init prompts of eval-demo's set")
    parser.add_argument("--prompt-seed", type=int, default=7, help="prompt_set's seed (7: eval-demo's)")
    parser.add_argument("--target-seed", type=int, default=23, help="seed of the new prompts' colour and shape")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--strengths", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0")
    parser.add_argument("--inpaint-contents", default=",".join(MASKED_CONTENT))
    parser.add_argument("--inpaint-strengths", default="0.75,1.0")
    parser.add_argument("--hires-cases", type=int, default=4, help="demo model: prompts of the hires part")
    parser.add_argument("--hires-upscalers", default=",".join(HIRES_UPSCALERS))
    parser.add_argument("--hires-strengths", default="0.3,0.5,0.7")
    parser.add_argument("--outpaint-cases", type=int, default=8)
    parser.add_argument("--outpaint-sizes", default=",".join(OUTPAINTS))
    parser.add_argument("--mid", type=Path, default=Path("/tmp/anima-mid"), help="the mid random model set "
                        "(made by make-tiny --preset mid when absent)")
    parser.add_argument("--mid-size", type=int, default=256, help="mid model: the first pass's side; hires is 2x")
    parser.add_argument("--mid-steps", type=int, default=10)
    parser.add_argument("--mid-strength", type=float, default=0.5)
    parser.add_argument("--mid-upscalers", default="latent,lanczos")
    parser.add_argument("--no-mid-direct", dest="mid_direct", action="store_false",
                        help="skip the direct txt2img at the hires size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=None, help="where the figures go (default docs/, "
                        "with --quick /tmp/image_to_image_quick)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument("--from-json", type=Path, default=None, help="measure nothing: print an earlier run's "
                        "tables (and the strength plot into --out-dir)")
    parser.add_argument("--quick", action="store_true", help="a small run: 2 cases, 8 steps, fewer settings, "
                        "mid 128 -> 256 at 4 steps")
    args = parser.parse_args()
    if args.quick:
        args.cases, args.hires_cases, args.outpaint_cases, args.steps = 2, 1, 1, 8
        args.strengths, args.inpaint_contents, args.inpaint_strengths = "0.3,0.6,0.9", "original,latent_noise", "1.0"
        args.hires_upscalers, args.hires_strengths, args.outpaint_sizes = "latent,lanczos", "0.5", "96x64"
        args.mid_size, args.mid_steps = 128, 4
    out_dir = args.out_dir or Path("/tmp/image_to_image_quick" if args.quick else Path(__file__).parent.parent / "docs")
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.from_json is not None:
        report = json.loads(args.from_json.read_text())
        print(markdown(report))
        if "strength" in report["parts"]:
            plot_strength(report["parts"]["strength"], out_dir / "image_to_image_strength.png")
        return
    torch.set_num_threads(args.threads)
    parts = _names(args.parts)
    cases = make_cases(args.cases, args.prompt_seed, args.target_seed)
    strengths, contents, inpaint_strengths = _floats(args.strengths), _names(args.inpaint_contents), \
        _floats(args.inpaint_strengths)
    hires_upscalers, hires_strengths = _names(args.hires_upscalers), _floats(args.hires_strengths)
    outpaint_sizes, mid_upscalers = _names(args.outpaint_sizes), _names(args.mid_upscalers)
    args.mid_upscalers = mid_upscalers
    demo_parts = [p for p in parts if p != "mid"]
    need = max([args.cases if p in ("strength", "inpaint") else args.hires_cases if p == "hires"
                else args.outpaint_cases for p in demo_parts] or [0])
    total = (need * bool(demo_parts) + ("strength" in parts) * args.cases * (len(strengths) + (1.0 in strengths))
             + ("inpaint" in parts) * args.cases * len(contents) * len(inpaint_strengths)
             + ("hires" in parts) * args.hires_cases * (1 + len(hires_upscalers) * len(hires_strengths))
             + ("outpaint" in parts) * args.outpaint_cases * len(outpaint_sizes)
             + ("mid" in parts) * (len(mid_upscalers) + args.mid_direct))
    began = time.perf_counter()
    report = {"date": datetime.date.today().isoformat(), "cpu_flags": cpu_flags(), "code": code_state(),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                           if k not in ("json", "from_json", "out_dir")}, "parts": {}}
    keep: dict = {}
    with tqdm(total=total, desc="runs", unit="run", file=sys.stderr, dynamic_ncols=True) as bar:
        if demo_parts:
            runner = Runner(demo_model_dir(), True, args.steps, args.cfg, IMAGE_SIZE)
            # The pipeline's gc.collect() after every denoise walks every live object: frozen, it skips the loaded
            # modules (as benchmarks/samplers.py does).
            gc.freeze()
            inits = []
            for case in cases[:need]:
                bar.set_postfix_str(f"init {case.index}")
                inits.append(runner.generate(prompt=case.init.caption, seed=case.init_seed)["image"])
                bar.update()
            if "strength" in parts:
                report["parts"]["strength"] = measure_strength(runner, cases, inits, strengths, bar, keep)
            if "inpaint" in parts:
                report["parts"]["inpaint"] = measure_inpaint(runner, cases, inits, contents, inpaint_strengths, bar,
                                                             keep)
            if "hires" in parts:
                n = args.hires_cases
                report["parts"]["hires"] = measure_hires(runner, cases[:n], inits[:n], hires_upscalers,
                                                         hires_strengths, bar, keep)
            if "outpaint" in parts:
                n = args.outpaint_cases
                report["parts"]["outpaint"] = measure_outpaint(runner, cases[:n], inits[:n], outpaint_sizes, bar,
                                                               keep)
            del runner
            gc.unfreeze()
            return_freed_memory()
        if "mid" in parts:
            report["parts"]["mid"] = measure_mid(args, bar)
    report["runtime_s"] = time.perf_counter() - began
    report["cpu_s"] = time.process_time()
    print(markdown(report))
    if "strength" in parts:
        plot_strength(report["parts"]["strength"], out_dir / "image_to_image_strength.png")
    if demo_parts:
        write_strip(report, keep, inits, cases, out_dir / "image_to_image.png")
    if "hires" in parts:
        write_hires_grid(report, keep, inits, cases, out_dir / "image_to_image_hires.png")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
