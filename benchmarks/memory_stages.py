"""Peak resident memory of each stage of one generation, beside the weights that stage holds.

Runs encode -> denoise -> decode exactly as `AnimaPipeline.generate` does, in one process, and resets the
kernel's peak-RSS counter (VmHWM, via /proc/self/clear_refs) at each stage boundary, so every stage's peak is
its own and the whole generation's peak is the largest of them. RSS counts the memory-mapped weight pages that
were touched, so weights used in place from the file are counted once, like copies. Memory does not depend on
the number of steps: one step (two passes with CFG) is the default. Linux only.

    .venv/bin/python benchmarks/memory_stages.py --model /tmp/anima-full --dtype bf16
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

import torch

from anima_rknn.core.memory import peak_rss, status_bytes
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import DTYPES, AnimaPipeline
from anima_rknn.model.io import load_dit
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.text import load_text_encoder
from anima_rknn.vae import load_vae

GIB = 1024**3


def measured(run: Callable[[], object]) -> tuple[object, int, int]:
    """Run `run` with the peak-RSS counter reset first; return its result, the RSS before it and the peak."""
    before = status_bytes("VmRSS")
    with peak_rss() as peak:
        result = run()
    if before is None or peak.bytes is None:
        raise SystemExit("needs Linux: /proc/self/status and a resettable VmHWM (/proc/self/clear_refs)")
    return result, before, peak.bytes


def held_bytes(module: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers a loaded model holds (its weights as they sit in memory)."""
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model set folder (e.g. make-tiny --preset full)")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="bodies' dtype; fp32 from a bf16 file casts the weights just in time, as generate does")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a Markdown table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    files = from_model_dir(args.model)
    params = GenerationParams(prompt="1girl, smile, looking at viewer, red hair", width=args.width,
                              height=args.height, steps=args.steps, dtype=args.dtype)
    baseline = status_bytes("VmRSS")
    pipe, setup_start, setup_peak = measured(lambda: AnimaPipeline(files))
    conditioning, encode_start, encode_peak = measured(
        lambda: pipe.encode(params.prompt, params.negative, params.dtype))
    denoised, denoise_start, denoise_peak = measured(lambda: pipe.denoise(conditioning, params))
    _, decode_start, decode_peak = measured(lambda: pipe.decode(denoised.sample.latent))
    generation_peak = max(setup_peak, encode_peak, denoise_peak, decode_peak)

    # What each stage's models hold once loaded, measured after the generation so it cannot affect its peaks.
    held = {"encode": held_bytes(load_text_encoder(files.text_encoder).model),
            "denoise": held_bytes(load_dit(files.dit, DTYPES[params.dtype], denoise_only=True, just_in_time=True)),
            "decode": held_bytes(load_vae(files.vae))}
    on_disk = {"encode": os.path.getsize(files.text_encoder), "denoise": os.path.getsize(files.dit),
               "decode": os.path.getsize(files.vae)}
    peaks = {"setup": setup_peak, "encode": encode_peak, "denoise": denoise_peak, "decode": decode_peak}
    starts = {"setup": setup_start, "encode": encode_start, "denoise": denoise_start, "decode": decode_start}
    largest = max(on_disk.values())
    result = {"dtype": params.dtype, "size": f"{args.width}x{args.height}", "steps": args.steps,
              "baseline_rss": baseline, "start_rss": starts, "peak_rss": peaks,
              "weights_on_disk": on_disk, "weights_held": held, "generation_peak_rss": generation_peak,
              "largest_stage_weights_on_disk": largest, "ratio_to_largest_on_disk": generation_peak / largest,
              "ratio_to_largest_held": generation_peak / max(held.values()), "finite": denoised.sample.finite}
    if args.json:
        print(json.dumps(result))
        return
    print(f"RSS after imports: {baseline / GIB:.2f} GiB; bodies {params.dtype}, {params.width}x{params.height}, "
          f"{args.steps} step(s)\n")
    print("| stage | RSS at start GiB | peak RSS GiB | weights on disk GiB | weights held GiB |")
    print("|---|---|---|---|---|")
    print(f"| setup (headers, tokenizers) | {setup_start / GIB:.2f} | {setup_peak / GIB:.2f} | | |")
    for stage in ("encode", "denoise", "decode"):
        print(f"| {stage} | {starts[stage] / GIB:.2f} | {peaks[stage] / GIB:.2f} | {on_disk[stage] / GIB:.2f} "
              f"| {held[stage] / GIB:.2f} |")
    print(f"| whole generation | | {generation_peak / GIB:.2f} | largest {largest / GIB:.2f} "
          f"(peak = {result['ratio_to_largest_on_disk']:.2f}x) | largest {max(held.values()) / GIB:.2f} "
          f"(peak = {result['ratio_to_largest_held']:.2f}x) |")


if __name__ == "__main__":
    main()
