"""Where the VAE decoder's activations come near fp16's limits, measured on the latents of real pictures.

    python benchmarks/vae_fp16.py [--vae FILE ...] [--size 512]

For each VAE file (default: the demo model's), decodes the encodings of varied pictures in fp32 and records,
per layer kind and stage: the largest |activation| (fp16 overflows past 65504) and the largest per-pixel sum of
squares over channels, which is what the RMS norms' ReduceL2 accumulates (Wan's RMS_norm is F.normalize over
channels: sum x^2 over up to 384 channels, overflowing fp16 long before x itself does). The NPU computes in
fp16; the simulator's end-to-end figures are verify-rknn's (README).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from anima_rknn.demo import demo_model_dir
from anima_rknn.model.model_set import LAYOUT, single_safetensors
from anima_rknn.vae.rescale import picture_latents
from anima_rknn.vae.wan import AttentionBlock, ResidualBlock, RMSNorm2d

FP16_MAX = 65504.0


def stage_of(name: str) -> str:
    if name.startswith("decoder.middle"):
        return "middle"
    if name.startswith("decoder.head"):
        return "head"
    if name.startswith("decoder.upsamples"):
        return f"up.{name.split('.')[2]}"
    return name.split(".")[1]  # decoder.conv1


def kind_of(module: torch.nn.Module) -> str | None:
    for kind, name in ((RMSNorm2d, "norm input"), (ResidualBlock, "residual out"),
                       (AttentionBlock, "attention out"), (torch.nn.Conv2d, "conv out")):
        if isinstance(module, kind):
            return name
    return None


def measure(vae_path: Path, size: int, count: int) -> dict[tuple[str, str], tuple[float, float]]:
    vae, latents = picture_latents(vae_path, count, size, seed=0)
    stats: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    hooks = []
    for name, module in vae.named_modules():
        kind = kind_of(module)
        if kind is None or not name.startswith("decoder"):
            continue

        def hook(module, inputs, output, key=(stage_of(name), kind)):
            x = (inputs[0] if key[1] == "norm input" else output).float()
            entry = stats[key]
            entry[0] = max(entry[0], float(x.abs().max()))
            entry[1] = max(entry[1], float((x * x).sum(dim=1).max()))

        hooks.append(module.register_forward_hook(hook))
    with torch.no_grad():
        for z in latents:
            vae.decode(z[None])
    for h in hooks:
        h.remove()
    return {key: tuple(value) for key, value in stats.items()}


def in_order(item: tuple[tuple[str, str], tuple[float, float]]) -> tuple[int, int, str]:
    """Decoder order: conv1, middle, up.0, up.1, ..., up.10, head."""
    stage, kind = item[0]
    if stage.startswith("up."):
        return 2, int(stage[3:]), kind
    return {"conv1": 0, "middle": 1, "head": 3}.get(stage, 4), 0, kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vae", type=Path, nargs="*", default=None)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--count", type=int, default=2)
    args = parser.parse_args()
    paths = args.vae or [single_safetensors(demo_model_dir() / LAYOUT["vae"], "VAE")]
    for path in paths:
        print(f"\n{path.name}, {args.count} pictures at {args.size} px")
        print("| stage | kind | max abs | max sum of squares over channels | fp16 headroom |")
        print("|---|---|---:|---:|---:|")
        for (stage, kind), (peak, squares) in sorted(measure(path, args.size, args.count).items(), key=in_order):
            worst = squares if kind == "norm input" else peak
            print(f"| {stage} | {kind} | {peak:.3g} | {squares:.3g} | {FP16_MAX / max(worst, 1e-30):.3g}x |")


if __name__ == "__main__":
    main()
