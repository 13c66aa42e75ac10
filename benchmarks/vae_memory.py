"""Peak memory of a VAE decode, measured, against the estimate that decides automatic tiling.

    python benchmarks/vae_memory.py [--dims 16 96] [--sizes 256 512 1024] [--tiled 2048]

Each decode runs in a fresh process (peak RSS = ru_maxrss after minus before), with random weights of the
project's Wan decoder at width `dim` (16 = the tiny/demo VAE, 96 = the real Qwen-Image VAE).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from anima_rknn.vae import WanVAEConfig
from anima_rknn.vae.tiling import decode_bytes, plan_tiling, tiled_decode_bytes

MEASURE = """
import json, resource, sys, torch
from anima_rknn.vae import WanVAE, WanVAEConfig, decode_tiled
dim, px, tile = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(2)
vae = WanVAE(WanVAEConfig(dim=dim), with_encoder=False).eval()
z = torch.randn(1, 16, px // 8, px // 8)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with torch.no_grad():
    vae.decode(z) if tile == 0 else decode_tiled(vae, z, tile, 64)
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024))
"""


def measure(dim: int, px: int, tile: int) -> int:
    done = subprocess.run([sys.executable, "-c", MEASURE, str(dim), str(px), str(tile)], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 96])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--tiled", type=int, nargs="*", default=[2048], help="sizes decoded in 512-px tiles (dim 16)")
    args = parser.parse_args()
    mib = 2**20
    print("| VAE dim | image | decode | measured peak | estimate | estimate / measured |")
    print("|---:|---:|---|---:|---:|---:|")
    rows = [(dim, px, 0) for dim in args.dims for px in args.sizes if not (dim > 32 and px > 512)]
    rows += [(16, px, 512) for px in args.tiled]
    for dim, px, tile in rows:
        config = WanVAEConfig(dim=dim)
        estimate = decode_bytes(config, px, px) if tile == 0 else tiled_decode_bytes(config, px, px, tile)
        assert tile == 0 or plan_tiling(config, px, px, "on", tile, None) == tile
        peak = measure(dim, px, tile)
        how = "one piece" if tile == 0 else f"{tile}-px tiles"
        print(f"| {dim} | {px}x{px} | {how} | {peak / mib:,.0f} MiB | {estimate / mib:,.0f} MiB | "
              f"{estimate / peak:.2f} |", flush=True)


if __name__ == "__main__":
    main()
