"""Time per DiT pass of Q8_0 / Q4_K GGUF against bf16 safetensors, interleaved in one process.

On a shared machine whose load drifts over minutes, cases timed one after another (benchmarks/gguf_memory.py) can
differ by the drift; here the three models are loaded side by side and their passes alternate, round by round, so
every case sees the same load. Full-width DiT with --blocks blocks, 512x512 (1024 tokens), batch 1, bf16 bodies.

    python benchmarks/gguf_pass_time.py [--blocks 1] [--rounds 5]
    python benchmarks/gguf_pass_time.py --blocks 28 --rounds 2 --cases q8_0 --files /tmp/dit
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_memory import write_files  # noqa: E402  (the same files as the memory benchmark)

CASES = {"bf16": ("bf16 safetensors", "bf16.safetensors"), "q8_0": ("Q8_0 GGUF", "q8_0.gguf"),
         "q4_k": ("Q4_K GGUF", "q4_k.gguf")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", nargs="+", choices=["q8_0", "q4_k"], default=["q8_0", "q4_k"])
    parser.add_argument("--files", type=Path, help="write (or reuse) the files here, as gguf_memory.py --files")
    args = parser.parse_args()
    from anima_rknn.model.io import load_dit, read_dit_config

    cases = [CASES["bf16"], *(CASES[key] for key in args.cases)]  # bf16 first: the baseline
    with tempfile.TemporaryDirectory() as tmp:
        folder = (args.files or Path(tmp)) / str(args.blocks)
        write_files(folder, args.blocks, {name for _, name in cases})
        config = read_dit_config(folder / "bf16.safetensors")
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, 16, 64, 64, generator=g)
        context = torch.randn(1, config.context_tokens, config.context_dim, generator=g)
        sigma = torch.tensor([0.7])
        models = {label: load_dit(folder / name, torch.bfloat16, denoise_only=True, just_in_time=True)
                  for label, name in cases}
        times: dict[str, list[float]] = {label: [] for label in models}
        with torch.no_grad():
            for model in models.values():
                model(x, sigma, context)  # warm-up
            for _ in range(args.rounds):
                for label, model in models.items():
                    start = time.perf_counter()
                    model(x, sigma, context)
                    times[label].append(time.perf_counter() - start)
    bf16 = times[cases[0][0]]
    print(f"full-width DiT, {args.blocks} block(s), 512x512, bf16 bodies, torch threads {torch.get_num_threads()}, "
          f"{args.rounds} interleaved rounds")
    # a round's ratio compares passes run a minute apart: steadier than either case's best under a drifting load
    print("| case | best pass | median pass | best vs bf16 | per-round ratios to bf16 (median) |")
    print("|---|---|---|---|---|")
    for label, values in times.items():
        ratios = [t / b for t, b in zip(values, bf16)]
        print(f"| {label} | {min(values):.2f} s | {statistics.median(values):.2f} s | {min(values) / min(bf16):.2f}x | "
              f"{', '.join(f'{r:.2f}' for r in ratios)} ({statistics.median(ratios):.2f}x) |")


if __name__ == "__main__":
    main()
