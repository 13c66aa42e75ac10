"""What the split costs and what its exact savings buy, on the CPU, for a random-weight DiT.

Per pass: the monolithic model vs the split engine (torch backend, savings off: the host overhead of running
3 bodies per block through the backend interface), low-precision torch bodies, and the ONNX Runtime backend.
Per CFG step (cond + uncond at one sigma): the split engine with and without the AdaLN / K/V savings.
All on the same number of threads. Prints a Markdown table.

    .venv/bin/python benchmarks/split_engine.py --preset mid --width 512 --height 512
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from anima_rknn.engine import make_engine
from anima_rknn.engine.backends.torch import TorchBackend
from anima_rknn.engine.split import SplitEngine
from anima_rknn.export.onnx import export_subgraphs
from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import load_dit, random_dit, save_dit


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up: allocator, ORT session first run
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="mid")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = PRESETS[args.preset]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((1, config.in_channels, args.height // 8, args.width // 8), generator=generator)
    cond, uncond = (torch.randn((1, config.context_tokens, config.context_dim), generator=generator)
                    for _ in range(2))
    size = dict(width=args.width, height=args.height)

    with tempfile.TemporaryDirectory() as tmp:
        dit_path = Path(tmp) / "dit.safetensors"
        save_dit(random_dit(config, seed=0), dit_path, dtype=torch.float32)
        dit = load_dit(dit_path)
        sigma = torch.tensor([0.5])
        rows: list[tuple[str, float]] = []

        def per_pass(label: str, velocity: Callable[[], object]) -> None:
            rows.append((label, median_seconds(velocity, args.repeats)))

        with torch.inference_mode():
            per_pass("monolithic dit(x, sigma, context), fp32", lambda: dit(x, sigma, cond))
        bare = SplitEngine(dit, TorchBackend(dit, cache_context_kv=False), share_modulations=False)
        per_pass("split, torch fp32, savings off", lambda: bare.velocity(x, 0.5, cond))
        for dtype in (torch.float16, torch.bfloat16):
            low = load_dit(dit_path, dtype)
            engine = SplitEngine(low, TorchBackend(low, dtype, cache_context_kv=False), share_modulations=False)
            per_pass(f"split, torch {str(dtype)[6:]} bodies, savings off", lambda: engine.velocity(x, 0.5, cond))
            del low, engine
        for export_dtype in ("float32", "float16"):
            subgraphs = export_subgraphs(dit_path, args.width, args.height, Path(tmp) / export_dtype, export_dtype,
                                         progress=False).parent
            onnx = make_engine(dit, "onnx", subgraphs=subgraphs, **size)
            per_pass(f"split, onnx {export_dtype} (ORT CPU)", lambda: onnx.velocity(x, 0.5, cond))
            onnx.close()

        def cfg_step(engine: SplitEngine) -> Callable[[], None]:
            sigmas = iter(torch.linspace(1, 0.01, 10_000).tolist())  # a new sigma every step, as in sampling

            def step() -> None:
                sigma_now = next(sigmas)
                engine.velocity(x, sigma_now, cond)
                engine.velocity(x, sigma_now, uncond)
            return step

        step_rows = [
            ("CFG step, split torch fp32, no savings", bare),
            ("CFG step, + AdaLN shared by cond/uncond", SplitEngine(dit, TorchBackend(dit, cache_context_kv=False))),
            ("CFG step, + K/V once per prompt", make_engine(dit, **size)),
        ]
        for label, engine in step_rows:
            rows.append((label, median_seconds(cfg_step(engine), args.repeats)))

    tokens = (args.width // 16) * (args.height // 16)
    print(f"\n{args.preset} preset ({config.blocks} blocks, hidden {config.hidden}), {args.width}x{args.height} "
          f"= {tokens} tokens, {args.threads} threads, median of {args.repeats}\n")
    monolithic, split = rows[0][1], rows[1][1]
    no_savings = next(t for label, t in rows if label.endswith("no savings"))
    print("| what | seconds | vs monolithic pass | vs step without savings |")
    print("|---|---:|---:|---:|")
    for label, seconds in rows:
        versus_step = f"{seconds / no_savings - 1:+.1%}" if label.startswith("CFG") else ""
        versus_pass = "" if label.startswith("CFG") else f"{seconds / monolithic - 1:+.1%}"
        print(f"| {label} | {seconds:.3f} | {versus_pass} | {versus_step} |")
    print(f"\nhost overhead of the split (savings off): {split / monolithic - 1:+.1%} per pass")


if __name__ == "__main__":
    main()
