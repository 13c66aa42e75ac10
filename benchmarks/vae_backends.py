"""VAE decode on the CPU: PyTorch vs ONNX Runtime on the same tiles, same threads, and torch in one piece; the
--vae-backend auto probe against the real ratio; FLOPs per tile and the board estimate they give.

    python benchmarks/vae_backends.py [--dim 96] [--sizes 512 1024] [--tile 512] [--overlap 64] [--threads 1]

Tiled, both decode through the same host tiling (vae.tiling.decode_tiled, one tile shape): torch runs the module
per tile, onnx runs the exported graph per tile in ONNX Runtime (intra-op threads = torch's); "torch one piece"
decodes the whole latent at once, as torch does whenever memory allows (what auto weighs onnx's tiles against).
Random weights of the project's Wan decoder at width `dim` (96 = the real Qwen-Image VAE). Each figure is the best
of --repeat decodes, process CPU time and wall time. The set is exported as auto's cache exports it (no fp16
calibration), timed. The probe (engine.vae_auto.measure_ratio) runs --repeat times, fresh. The board estimate
divides the decoder's FLOPs (counted by torch's FlopCounterMode on the real module) by a range of sustained NPU
throughputs: an estimate, not a measurement.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from anima_rknn.engine.backends.onnx import OnnxBackend
from anima_rknn.engine.vae_auto import measure_ratio, onnx_is_faster
from anima_rknn.engine.vae_tiles import BackendTileDecoder
from anima_rknn.export.manifest import read_manifest
from anima_rknn.export.vae import export_vae_decoder
from anima_rknn.vae import WanVAE, WanVAEConfig, decode_tiled, random_vae, save_vae
from anima_rknn.vae.tiling import _tile_starts

# RK3588 NPU: 3 cores x 512 fp16 MAC/cycle x ~1 GHz = ~3 TFLOPS theoretical (spec: rknn.md). Convolutions
# reach a fraction of it; the range below brackets 10% (memory-bound layers, small channel counts) to 50%.
NPU_PEAK_FLOPS = 3.07e12
NPU_EFFICIENCY = (0.10, 0.50)
BOARD_CPU_DECODE_S = 155.0  # the on-device report's tiled CPU decode at 512x512 (spec: rknn.md)


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text()
    return " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_bf16)\b", text)))) or "none of them"


def tile_flops(config: WanVAEConfig, tile: int) -> int:
    with torch.device("meta"):
        vae = WanVAE(config, with_encoder=False)
        z = torch.zeros(1, config.z_dim, tile // config.scale_factor, tile // config.scale_factor)
    with FlopCounterMode(display=False) as counter:
        vae.decoder(vae.conv2(z))
    return counter.get_total_flops()


def tiles_for(px: int, tile: int, overlap: int, scale: int) -> int:
    return len(_tile_starts(px // scale, tile // scale, overlap // scale)) ** 2


def best_of(repeat: int, decode) -> tuple[float, float, torch.Tensor]:
    """Best CPU and wall seconds of `repeat` decodes, and the decoded image."""
    cpu, wall = [], []
    for _ in range(repeat):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        with torch.no_grad():
            image = decode()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start_wall)
    return min(cpu), min(wall), image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=96)
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--tile", type=int, default=512)
    parser.add_argument("--overlap", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = WanVAEConfig(dim=args.dim)
    flops = tile_flops(config, args.tile)
    print(f"CPU flags: {cpu_flags()}; {args.threads} thread(s); VAE dim {args.dim}; {args.tile}-px tiles, "
          f"overlap {args.overlap}; decoder {flops / 1e9:.0f} GFLOP per tile")
    probes = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        probes.append((measure_ratio(), time.perf_counter() - start))
    print("auto's probe, onnx / torch: " + ", ".join(f"{r:.2f} ({s:.1f} s wall)" for r, s in probes))
    with tempfile.TemporaryDirectory() as scratch:
        vae_path, set_dir = Path(scratch) / "vae.safetensors", Path(scratch) / "set"
        save_vae(random_vae(config, seed=0), vae_path, dtype=torch.float32)
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        export_vae_decoder(vae_path, set_dir, args.tile, args.overlap, calibrate=False)
        print(f"export without fp16 calibration (auto's cache): {time.process_time() - start_cpu:.1f} s CPU, "
              f"{time.perf_counter() - start_wall:.1f} s wall")
        manifest = read_manifest(set_dir, kind="vae")
        vae = random_vae(config, seed=0)
        vae.encoder = vae.conv1 = None
        onnx = BackendTileDecoder(OnnxBackend(set_dir, manifest), manifest)
        print("| image | tiles | torch CPU s | onnx CPU s | onnx / torch | torch one piece CPU s | torch wall s | "
              "onnx wall s | one piece wall s | max abs diff | auto picks (probe) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for px in args.sizes:
            z = torch.randn(1, config.z_dim, px // 8, px // 8, generator=torch.Generator().manual_seed(px))
            tiles = tiles_for(px, args.tile, args.overlap, config.scale_factor)
            torch_cpu, torch_wall, want = best_of(args.repeat, lambda: decode_tiled(vae, z, args.tile, args.overlap))
            onnx_cpu, onnx_wall, got = best_of(args.repeat, lambda: decode_tiled(onnx, z, args.tile, args.overlap))
            if tiles == 1:  # decode_tiled decodes one tile as one piece
                whole_cpu, whole_wall = torch_cpu, torch_wall
            else:
                whole_cpu, whole_wall, _ = best_of(args.repeat, lambda: vae.decode(z))
            diff = (got - want).abs().max()
            picks = "onnx" if onnx_is_faster(probes[0][0], px, px, args.tile, args.overlap, None) else "torch"
            fastest = "onnx" if onnx_cpu < whole_cpu else "torch"
            print(f"| {px}x{px} | {tiles} | {torch_cpu:.2f} | {onnx_cpu:.2f} | {onnx_cpu / torch_cpu:.2f} | "
                  f"{whole_cpu:.2f} | {torch_wall:.2f} | {onnx_wall:.2f} | {whole_wall:.2f} | {float(diff):.1e} | "
                  f"{picks} (measured: {fastest}) |", flush=True)
        onnx.close()
    low, high = (flops / (NPU_PEAK_FLOPS * e) for e in reversed(NPU_EFFICIENCY))
    print(f"board estimate (not measured): {flops / 1e9:.0f} GFLOP per {args.tile}-px tile / "
          f"{NPU_PEAK_FLOPS / 1e12:.2f} TFLOPS fp16 peak at {NPU_EFFICIENCY[0]:.0%}-{NPU_EFFICIENCY[1]:.0%} "
          f"= {low:.1f}-{high:.1f} s per tile; a 512x512 image is {tiles_for(512, args.tile, args.overlap, 8)} "
          f"tile(s), against {BOARD_CPU_DECODE_S:.0f} s on the board's CPU")


if __name__ == "__main__":
    main()
