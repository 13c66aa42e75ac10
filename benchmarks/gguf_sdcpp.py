"""Our GGUF path against the independent reference, stable-diffusion.cpp (the stable-diffusion-cpp-python binding).

A random set in the real formats is written: a full-width DiT with a few blocks, the full Qwen3-0.6B shapes and the
full Wan VAE. stable-diffusion.cpp's own converter writes a Q8_0 GGUF of the DiT, and `anima-rknn quantize` writes
another. Each (file, implementation) pair makes one image with the same seed, prompt, sigmas (ours, handed to
stable-diffusion.cpp as custom sigmas), Euler, CFG and size; stable-diffusion.cpp's "cpu" RNG draws torch's CPU
noise, as ours does. Printed: PSNRs between the images.

stable-diffusion-cpp-python builds from source (no wheel on PyPI): it is not a project dependency. Install it by
hand into some environment and point --sd-python at that interpreter:

    pip install stable-diffusion-cpp-python   # about 18 minutes on 2 busy cores
    python benchmarks/gguf_sdcpp.py --sd-python /path/to/venv/bin/python --tokenizers DIR [--blocks 2]

`--q8-activations` adds a row: our renderer with each Q8_0 layer's input rounded as ggml's CPU matmul rounds it
(see q8_0_activations), to show whether that rounding is what separates the two implementations on a Q8_0 file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

PROMPT, NEGATIVE = "a cat sitting on a wooden table, anime style", "low quality"

_SD_SCRIPT = """
import json, sys
from stable_diffusion_cpp import StableDiffusion
from stable_diffusion_cpp import stable_diffusion_cpp as sd_cpp
args = json.loads(sys.argv[1])
if args["mode"] == "convert":
    ok = sd_cpp.convert(args["dit"].encode(), b"", args["out"].encode(), sd_cpp.GGMLType.SD_TYPE_Q8_0, b"", False)
    sys.exit(0 if ok else 1)
sd = StableDiffusion(diffusion_model_path=args["dit"], llm_path=args["text_encoder"], vae_path=args["vae"],
                     rng_type="cpu", sampler_rng_type="cpu", vae_decode_only=True, n_threads=2, verbose=False)
image = sd.generate_image(prompt=args["prompt"], negative_prompt=args["negative"], cfg_scale=args["cfg"],
                          width=args["size"], height=args["size"], sample_method="euler", sample_steps=args["steps"],
                          sigmas=args["sigmas"], seed=args["seed"])[0]
image.save(args["out"])
"""


def q8_0_activations(x: torch.Tensor) -> torch.Tensor:
    """`x` as ggml's CPU backend hands it to a Q8_0 weight's matrix multiply: type_traits_cpu[GGML_TYPE_Q8_0]
    .vec_dot_type is GGML_TYPE_Q8_0 (ggml/src/ggml-cpu/ggml-cpu.c), so ggml_compute_forward_mul_mat quantizes each
    f32 row of src1 with quantize_row_q8_0 before ggml_vec_dot_q8_0_q8_0: per 32 values along the reduced
    dimension, d = amax / 127 (stored as fp16), q = round(x * 127 / amax) (x86: _mm256_round_ps, half to even,
    as torch.round). The block sums of q_w * q_x are exact integers, so this rounding is the only difference."""
    blocks = x.float().reshape(-1, 32)
    amax = blocks.abs().amax(1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127 / amax, 0))
    return (q * (amax / 127).half().float()).reshape(x.shape).to(x.dtype)


def _generate_with_q8_0_activations(argv: list[str]) -> None:
    """`anima-rknn generate argv` in this process, every Q8_0 layer's input rounded by q8_0_activations."""
    from anima_rknn.cli import main
    from anima_rknn.model.quantized import QuantizedLinear

    plain = QuantizedLinear.forward

    def forward(self: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
        return plain(self, q8_0_activations(x) if self.qweight.dtype == "Q8_0" else x)

    QuantizedLinear.forward = forward  # type: ignore[method-assign]
    sys.argv = ["anima-rknn", "generate", *argv]
    main()


def write_set(folder: Path, blocks: int, tokenizers: Path) -> dict[str, Path]:
    """The model files in the real formats (the full Qwen3 shapes: stable-diffusion.cpp hard-codes them)."""
    import shutil

    from anima_rknn.demo.tiny_set import FULL_QWEN_VOCAB, TEXT_ENCODERS
    from anima_rknn.model.config import PRESETS
    from anima_rknn.model.io import random_dit, save_dit
    from anima_rknn.text.encoder import write_random_text_encoder
    from anima_rknn.vae.io import random_vae, save_vae
    from anima_rknn.vae.wan import WanVAEConfig

    files = {"dit": folder / "dit.safetensors", "text_encoder": folder / "qwen3.safetensors",
             "vae": folder / "vae.safetensors", "qwen_tokenizer": folder / "qwen3", "t5_tokenizer": folder / "t5"}
    save_dit(random_dit(dataclasses.replace(PRESETS["full"], blocks=blocks), seed=0), files["dit"])
    write_random_text_encoder(files["text_encoder"], hidden=1024, vocab=FULL_QWEN_VOCAB, seed=1,
                              **TEXT_ENCODERS["full"])
    save_vae(random_vae(WanVAEConfig(), seed=2), files["vae"])
    for name in ("qwen3", "t5"):
        shutil.copytree(tokenizers / name, folder / name)
    return files


def ours(files: dict[str, Path], dit: Path, out: Path, args: argparse.Namespace, q8_activations: bool = False,
         ) -> Path:
    command = [__file__, "--generate-q8-activations"] if q8_activations else ["-m", "anima_rknn", "generate"]
    subprocess.run([sys.executable, *command, "--dit", dit, "--text-encoder",
                    files["text_encoder"], "--vae", files["vae"], "--qwen-tokenizer", files["qwen_tokenizer"],
                    "--t5-tokenizer", files["t5_tokenizer"], "--prompt", PROMPT, "--negative", NEGATIVE,
                    "--seed", str(args.seed), "--steps", str(args.steps), "--cfg", str(args.cfg), "--sampler",
                    "euler", "--width", str(args.size), "--height", str(args.size), "--dtype", "fp32",
                    "--out", out, "--overwrite"], check=True, capture_output=True)
    return out


def theirs(files: dict[str, Path], dit: Path, out: Path, args: argparse.Namespace, sigmas: str) -> Path:
    job = {"mode": "generate", "dit": str(dit), "text_encoder": str(files["text_encoder"]), "vae": str(files["vae"]),
           "prompt": PROMPT, "negative": NEGATIVE, "cfg": args.cfg, "size": args.size, "steps": args.steps,
           "sigmas": sigmas, "seed": args.seed, "out": str(out)}
    subprocess.run([args.sd_python, "-c", _SD_SCRIPT, json.dumps(job)], check=True, capture_output=True)
    return out


def vae_check(files: dict[str, Path], folder: Path, args: argparse.Namespace) -> float:
    """stable-diffusion.cpp's converter writes the VAE as a GGUF (its 5-D convolutions folded to 4-D); the largest
    difference between our decodes of a random latent from that file and from the safetensors."""
    from anima_rknn.vae.io import load_vae

    converted = folder / "vae-sdcpp.gguf"
    job = {"mode": "convert", "dit": str(files["vae"]), "out": str(converted)}
    subprocess.run([args.sd_python, "-c", _SD_SCRIPT, json.dumps(job)], check=True, capture_output=True)
    latent = torch.randn(1, 16, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours_, theirs_ = (load_vae(path).decode(latent) for path in (files["vae"], converted))
    return float((ours_ - theirs_).abs().max())


def psnr(a: Path, b: Path) -> float:
    x, y = (np.asarray(Image.open(p).convert("RGB"), dtype=np.float64) for p in (a, b))
    mse = float(np.mean((x - y) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sd-python", required=True, help="an interpreter with stable-diffusion-cpp-python")
    parser.add_argument("--tokenizers", type=Path, required=True, help="folder with the real qwen3/ and t5/")
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=20260812)
    parser.add_argument("--keep", type=Path, help="write the set and images here instead of a temporary folder")
    parser.add_argument("--q8-activations", action="store_true",
                        help="also render the Q8_0 files with ggml's Q8_0 rounding of each quantized layer's input")
    if sys.argv[1:2] == ["--generate-q8-activations"]:
        _generate_with_q8_0_activations(sys.argv[2:])
        return
    args = parser.parse_args()
    from anima_rknn.model.quantize import quantize_checkpoint
    from anima_rknn.sampling.schedule import flow_sigmas

    sigmas = ",".join(f"{s:.9g}" for s in flow_sigmas(args.steps))
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        files = write_set(folder, args.blocks, args.tokenizers)
        print(f"VAE GGUF written by stable-diffusion.cpp's converter, decoded here: max abs diff "
              f"{vae_check(files, folder, args):.3g} from the safetensors VAE's decode", flush=True)
        sd_q8, our_q8 = folder / "dit-sdcpp-q8_0.gguf", folder / "dit-ours-q8_0.gguf"
        job = {"mode": "convert", "dit": str(files["dit"]), "out": str(sd_q8)}
        subprocess.run([args.sd_python, "-c", _SD_SCRIPT, json.dumps(job)], check=True, capture_output=True)
        quantize_checkpoint(files["dit"], our_q8, "q8_0")
        images = {}
        for label, dit in (("safetensors", files["dit"]), ("sd.cpp Q8_0", sd_q8), ("our Q8_0", our_q8)):
            images[label, "ours"] = ours(files, dit, folder / f"ours {label}.png", args)
            images[label, "sd.cpp"] = theirs(files, dit, folder / f"sdcpp {label}.png", args, sigmas)
        print(f"full-width DiT with {args.blocks} blocks, {args.size}x{args.size}, {args.steps} Euler steps, "
              f"CFG {args.cfg}, seed {args.seed}; PSNR in dB")
        print("| DiT file | ours vs stable-diffusion.cpp | ours: file vs our safetensors run |")
        print("|---|---|---|")
        for label in ("safetensors", "sd.cpp Q8_0", "our Q8_0"):
            print(f"| {label} | {psnr(images[label, 'ours'], images[label, 'sd.cpp']):.2f} | "
                  f"{psnr(images[label, 'ours'], images['safetensors', 'ours']):.2f} |")
        if args.q8_activations:
            for label, dit in (("sd.cpp Q8_0", sd_q8), ("our Q8_0", our_q8)):
                image = ours(files, dit, folder / f"ours-q8act {label}.png", args, q8_activations=True)
                print(f"| {label}, our inputs of Q8_0 layers rounded to q8_0 | "
                      f"{psnr(image, images[label, 'sd.cpp']):.2f} | {psnr(image, images['safetensors', 'ours']):.2f} |")


if __name__ == "__main__":
    main()
