"""What the split costs and what its exact savings buy, on the CPU, for a random-weight DiT.

Per pass: the monolithic model vs the split engine (torch backend, savings off: the host overhead of running
3 bodies per block through the backend interface), low-precision torch bodies, and the ONNX Runtime backend.
Per CFG step (cond + uncond at one sigma): the split engine with and without the AdaLN / K/V savings. And what
`auto`'s check costs: a partial pass (the first block alone) against a full pass on the same engine.
All on the same number of threads. Prints a Markdown table.

    .venv/bin/python benchmarks/split_engine.py --preset mid --width 512 --height 512
"""

from __future__ import annotations

import argparse
import functools
import math
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


def best_seconds(candidates: dict[str, Callable[[], object]], rounds: int,
                 clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Best of `rounds`, candidates interleaved: on a shared machine, background load hits all of them alike."""
    for run in candidates.values():
        run()  # warm-up: allocator, ORT's first run
    best = dict.fromkeys(candidates, math.inf)
    for _ in range(rounds):
        for label, run in candidates.items():
            start = clock()
            run()
            best[label] = min(best[label], clock() - start)
    return best


def cfg_step(engine: SplitEngine, x: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor) -> Callable[[], None]:
    """One guided step: cond + uncond passes at a sigma never seen before, as in sampling."""
    sigmas = iter(torch.linspace(1, 0.01, 10_000).tolist())

    def step() -> None:
        sigma = next(sigmas)
        engine.velocity(x, sigma, cond)
        engine.velocity(x, sigma, uncond)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="mid")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--cpu-time", action="store_true",
                        help="Time with the process's CPU time, not wall time: steadier on a loaded machine "
                             "(with --threads 1 it equals wall time on an idle one).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = PRESETS[args.preset]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((1, config.in_channels, args.height // 8, args.width // 8), generator=generator)
    cond, uncond = (torch.randn((1, config.context_tokens, config.context_dim), generator=generator)
                    for _ in range(2))
    size = {"width": args.width, "height": args.height}

    with tempfile.TemporaryDirectory() as tmp:
        dit_path = Path(tmp) / "dit.safetensors"
        save_dit(random_dit(config, seed=0), dit_path, dtype=torch.float32)
        dit = load_dit(dit_path)
        # Per-pass rows run with the savings off: the split's own cost, and each backend's.
        engines = {"split, torch fp32": SplitEngine(dit, TorchBackend(dit, cache_context_kv=False),
                                                    share_modulations=False)}
        for dtype in (torch.float16, torch.bfloat16):
            low = load_dit(dit_path, dtype)
            engines[f"split, torch {str(dtype)[6:]} bodies"] = SplitEngine(
                low, TorchBackend(low, dtype, cache_context_kv=False), share_modulations=False)
        for export_dtype in ("float32", "float16"):
            subgraphs = export_subgraphs(dit_path, args.width, args.height, Path(tmp) / export_dtype, export_dtype,
                                         progress=False).parent
            engines[f"split, onnx {export_dtype} (ORT CPU)"] = make_engine(dit, "onnx", subgraphs=subgraphs, **size)
        monolithic = "monolithic dit(x, sigma, context), fp32"
        passes = {monolithic: lambda: dit(x, torch.tensor([0.5]), cond)}
        passes.update({label: functools.partial(engine.velocity, x, 0.5, cond) for label, engine in engines.items()})
        no_savings = "CFG step, split torch fp32, no savings"
        steps = {
            no_savings: cfg_step(engines["split, torch fp32"], x, cond, uncond),
            "CFG step, + AdaLN shared by cond/uncond":
                cfg_step(SplitEngine(dit, TorchBackend(dit, cache_context_kv=False)), x, cond, uncond),
            "CFG step, + K/V once per prompt": cfg_step(make_engine(dit, **size), x, cond, uncond),
        }
        checked = make_engine(dit, **size)  # as generate runs it: AdaLN and K/V once
        full, partial = "full pass, split torch fp32 (as generate runs it)", "partial pass: first block alone (check)"
        passes.update({full: functools.partial(checked.velocity, x, 0.5, cond),
                       partial: functools.partial(checked.first_block, x, 0.5, cond)})
        with torch.inference_mode():
            clock = time.process_time if args.cpu_time else time.perf_counter
            timed = best_seconds({**passes, **steps}, args.repeats, clock)

    tokens = (args.width // 16) * (args.height // 16)
    print(f"\n{args.preset} preset ({config.blocks} blocks, hidden {config.hidden}), {args.width}x{args.height} "
          f"= {tokens} tokens, {args.threads} threads, {'CPU' if args.cpu_time else 'wall'} seconds, "
          f"best of {args.repeats} interleaved rounds\n")
    print("| what | seconds | vs monolithic pass | vs step without savings |")
    print("|---|---:|---:|---:|")
    for label, seconds in timed.items():
        versus_pass = "" if label in steps else f"{seconds / timed[monolithic] - 1:+.1%}"
        versus_step = f"{seconds / timed[no_savings] - 1:+.1%}" if label in steps else ""
        print(f"| {label} | {seconds:.3f} | {versus_pass} | {versus_step} |")
    overhead = timed["split, torch fp32"] / timed[monolithic] - 1
    print(f"\nhost overhead of the split (no savings): {overhead:+.1%} per pass")
    print(f"auto's check: a partial pass costs {timed[partial] / timed[full]:.1%} of a full pass "
          f"(1 / blocks = {1 / config.blocks:.1%})")


if __name__ == "__main__":
    main()
