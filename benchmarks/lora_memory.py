"""What merging a LoRA at load costs in memory, on the full-size DiT.

A full-size random DiT (Anima's 2B shapes, bf16, written tensor by tensor) and a realistic LoRA (rank 32 on
every attention and MLP linear of the 28 blocks, bf16, ComfyUI layout) are made in a temporary folder unless
given. Each case loads the DiT as the denoising loop does (denoise_only) in a fresh process, reads every weight
once (so mapped pages count as they would in a run), and reports the process's peak RSS.

    python benchmarks/lora_memory.py [--dit FILE] [--lora FILE] [--dtype bf16 fp32]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

RANK = 32
_BODY_LINEAR = re.compile(r"blocks\.\d+\.(self_attn|cross_attn|mlp)\.\w+$")


def write_full_dit(path: Path) -> None:
    from anima_rknn.core.tensorfile import save_tensors
    from anima_rknn.model.config import PRESETS
    from anima_rknn.model.io import expected_shapes

    g = torch.Generator().manual_seed(0)
    tensors = {f"net.{name}": (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
               for name, shape in expected_shapes(PRESETS["full"]).items()}
    save_tensors(tensors, path)


def write_lora(path: Path) -> int:
    """A rank-32 LoRA on every attention and MLP linear of the blocks; returns how many weights it touches."""
    from anima_rknn.core.tensorfile import save_tensors
    from anima_rknn.model.config import PRESETS
    from anima_rknn.model.lora import linear_shapes

    g = torch.Generator().manual_seed(1)
    tensors = {}
    for module, (out, inp) in linear_shapes(PRESETS["full"]).items():
        if _BODY_LINEAR.fullmatch(module):
            tensors[f"diffusion_model.{module}.lora_A.weight"] = torch.randn(RANK, inp, generator=g).to(torch.bfloat16)
            tensors[f"diffusion_model.{module}.lora_B.weight"] = torch.zeros(out, RANK).to(torch.bfloat16)
    save_tensors(tensors, path)
    return len(tensors) // 2


def measure(dit: str, lora: str | None, dtype: str) -> dict:
    """One case, in this (fresh) process."""
    from anima_rknn.generation.pipeline import DTYPES
    from anima_rknn.model.io import load_dit, read_dit_config
    from anima_rknn.model.lora import LoraRef, open_loras

    loras = open_loras([LoraRef(Path(lora))], read_dit_config(dit)) if lora else []
    model = load_dit(dit, DTYPES[dtype], denoise_only=True, loras=loras)
    with torch.no_grad():
        for parameter in model.parameters():  # every page read once, as a denoising pass reads them
            parameter.sum()
    touched = sum(model.state_dict()[name].nbytes for lora in loras for name in lora.layers)
    return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "touched_bytes": touched}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dit")
    parser.add_argument("--lora")
    parser.add_argument("--dtype", nargs="+", default=["bf16", "fp32"])
    parser.add_argument("--case", nargs=3, help=argparse.SUPPRESS)  # dit lora|- dtype: run one case here
    args = parser.parse_args()
    if args.case:
        dit, lora, dtype = args.case
        print(json.dumps(measure(dit, None if lora == "-" else lora, dtype)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        dit = args.dit or str(Path(tmp) / "dit.safetensors")
        lora = args.lora or str(Path(tmp) / "lora.safetensors")
        if not args.dit:
            write_full_dit(Path(dit))
        if not args.lora:
            write_lora(Path(lora))
        gib = 2**30
        print(f"DiT {Path(dit).stat().st_size / gib:.2f} GiB, LoRA {Path(lora).stat().st_size / 2**20:.1f} MiB "
              f"(rank {RANK}, attention + MLP linears of every block)")
        print("| bodies | peak RSS without LoRA | with LoRA | growth | weights the LoRA touches |")
        print("|---|---|---|---|---|")
        for dtype in args.dtype:
            runs = [json.loads(subprocess.run([sys.executable, __file__, "--case", dit, name, dtype], check=True,
                                              capture_output=True, text=True).stdout) for name in ("-", lora)]
            base, merged = runs[0]["peak_rss"], runs[1]["peak_rss"]
            print(f"| {dtype} | {base / gib:.2f} GiB | {merged / gib:.2f} GiB | {(merged - base) / gib:+.2f} GiB "
                  f"| {runs[1]['touched_bytes'] / gib:.2f} GiB |")


if __name__ == "__main__":
    main()
