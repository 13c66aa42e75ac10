"""Peak memory of a VAE decode and encode, measured, against the estimates that decide automatic tiling.

    python benchmarks/vae_memory.py [--dims 16 96] [--sizes 256 512 1024] [--tiled 2048] [--parts decode encode]

Each decode (encode) runs in a fresh process: its peak RSS (ru_maxrss) after, minus its RSS before, with the peak
reset before (/proc/self/clear_refs), so what importing torch and building the model touched does not count.
Random weights of the project's Wan decoder (encoder) at width `dim` (16 = the tiny/demo VAE, 96 = the real
Qwen-Image VAE).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from anima_rknn.vae import WanVAEConfig
from anima_rknn.vae.tiling import (
    decode_bytes,
    encode_bytes,
    plan_encode_tiling,
    plan_tiling,
    tiled_decode_bytes,
    tiled_encode_bytes,
)

MEASURE = """
import json, resource, sys, torch
from anima_rknn.vae import WanVAE, WanVAEConfig, decode_tiled
from anima_rknn.vae.tiling import encode_tiled
part, dim, px, tile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(2)
vae = WanVAE(WanVAEConfig(dim=dim), with_encoder=part == "encode").eval()
x = torch.randn(1, 16, px // 8, px // 8) if part == "decode" else torch.rand(1, 3, px, px)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak to the RSS now
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with torch.no_grad():
    if part == "decode":
        vae.decode(x) if tile == 0 else decode_tiled(vae, x, tile, 64)
    else:
        vae.encode(x) if tile == 0 else encode_tiled(vae, x, tile, 64)
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024))
"""
ESTIMATES = {"decode": (decode_bytes, tiled_decode_bytes, plan_tiling),
             "encode": (encode_bytes, tiled_encode_bytes, plan_encode_tiling)}


def measure(part: str, dim: int, px: int, tile: int) -> int:
    done = subprocess.run([sys.executable, "-c", MEASURE, part, str(dim), str(px), str(tile)], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 96])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--tiled", type=int, nargs="*", default=[2048], help="sizes done in 512-px tiles (dim 16)")
    parser.add_argument("--parts", nargs="+", choices=list(ESTIMATES), default=list(ESTIMATES))
    args = parser.parse_args()
    mib = 2**20
    print("| VAE dim | image | pass | measured peak | estimate | estimate / measured |")
    print("|---:|---:|---|---:|---:|---:|")
    for part in args.parts:
        whole_bytes, tiled_bytes, plan = ESTIMATES[part]
        # the full-width decoder past 512 px takes minutes and GBs; the encoder's attention dominates sooner
        rows = [(dim, px, 0) for dim in args.dims for px in args.sizes
                if not (part == "decode" and dim > 32 and px > 512)]
        rows += [(16, px, 512) for px in args.tiled]
        for dim, px, tile in rows:
            config = WanVAEConfig(dim=dim)
            estimate = whole_bytes(config, px, px) if tile == 0 else tiled_bytes(config, px, px, tile)
            assert tile == 0 or plan(config, px, px, "on", tile, None) == tile
            peak = measure(part, dim, px, tile)
            how = f"{part}, " + ("one piece" if tile == 0 else f"{tile}-px tiles")
            print(f"| {dim} | {px}x{px} | {how} | {peak / mib:,.0f} MiB | {estimate / mib:,.0f} MiB | "
                  f"{estimate / peak:.2f} |", flush=True)


if __name__ == "__main__":
    main()
