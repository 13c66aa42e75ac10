"""How close one DiT pass comes to the machine's own dense matmul throughput.

Times `dit(x, sigma, context)` (the public API: prologue, 28 blocks, epilogue, cross-attention K/V included)
and a large square torch matmul in the bodies' dtype on the same threads, interleaved so that both see the
same machine load, and reports achieved FLOP/s of the pass / FLOP/s of the matmul. FLOPs are counted
analytically (2 per multiply-add of every linear layer and attention matmul at batch 1; the elementwise work
is not counted, so it only costs time). Best of the rounds is reported, as the machine is shared.
`--dtype auto` takes the dtype generate would pick on this CPU (anima_rknn.core.cpu_speed); the matmul is always in
the dtype the bodies compute in. With `--just-in-time`, a second load keeps the file's bf16 weights and casts
them block by block as the pass runs (what generate does for fp32 bodies); its pass is timed in the same rounds
and reported against the resident one, in wall time and in process CPU time (with --threads 1 the CPU time is
what a shared, busy machine cannot blur).

    .venv/bin/python benchmarks/dit_throughput.py --dit /tmp/anima-full/split_files/diffusion_models/*.safetensors
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from anima_rknn.core.cpu_speed import resolve_dtype
from anima_rknn.model.config import DiTConfig
from anima_rknn.model.io import load_dit

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def linear_flops(rows: int, fan_in: int, fan_out: int) -> int:
    return 2 * rows * fan_in * fan_out


def dit_pass_flops(config: DiTConfig, tokens: int) -> int:
    """Matmul FLOPs of one batch-1 pass over `tokens` image tokens with a full `context_tokens` context."""
    d, ctx = config.hidden, config.context_tokens
    self_attn = 4 * linear_flops(tokens, d, d) + 2 * linear_flops(tokens, d, tokens)  # QK^T and AV
    cross_attn = (2 * linear_flops(tokens, d, d) + 2 * linear_flops(ctx, config.context_dim, d)
                  + 2 * linear_flops(tokens, d, ctx))
    mlp = linear_flops(tokens, d, config.mlp) + linear_flops(tokens, config.mlp, d)
    adaln = 3 * (linear_flops(1, d, config.adaln_lora) + linear_flops(1, config.adaln_lora, 3 * d))
    patches = config.patch * config.patch
    edges = (linear_flops(tokens, (config.in_channels + 1) * patches, d)
             + linear_flops(tokens, d, patches * config.in_channels))
    return config.blocks * (self_attn + cross_attn + mlp + adaln) + edges


def seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dit", required=True, help="DiT+adapter safetensors (e.g. make-tiny --preset full)")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help="dtype of the attention/MLP bodies")
    parser.add_argument("--just-in-time", action="store_true",
                        help="also time a load that casts the file's narrower weights just in time")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved (matmul, pass) rounds; best is kept")
    parser.add_argument("--matmul-size", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a Markdown table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.dtype = resolve_dtype(args.dtype)
    dtype = DTYPES[args.dtype]

    dit = load_dit(args.dit, dtype)
    lean = load_dit(args.dit, dtype, just_in_time=True) if args.just_in_time else None
    config = dit.config
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((1, config.in_channels, args.height // 8, args.width // 8), generator=generator)
    context = torch.randn((1, config.context_tokens, config.context_dim), generator=generator)
    sigma = torch.tensor([0.5])
    tokens = (args.height // 8 // config.patch) * (args.width // 8 // config.patch)
    pass_flops = dit_pass_flops(config, tokens)

    n = args.matmul_size
    a, b = (torch.randn((n, n), generator=generator).to(dtype) for _ in range(2))
    matmul_flops = 2 * n**3

    def one_pass(model=dit) -> None:
        with torch.inference_mode():
            model(x, sigma, context)

    one_pass()  # warm-up: first touch of the memory-mapped weights, allocator, oneDNN kernels
    torch.matmul(a, b)
    matmul_s, pass_s, lean_s, pass_cpu, lean_cpu = [], [], [], [], []
    if lean is not None:
        one_pass(lean)
    for _ in range(args.rounds):
        matmul_s.append(min(seconds(lambda: torch.matmul(a, b)) for _ in range(3)))
        cpu = time.process_time()
        pass_s.append(seconds(one_pass))
        pass_cpu.append(time.process_time() - cpu)
        if lean is not None:
            cpu = time.process_time()
            lean_s.append(seconds(lambda: one_pass(lean)))
            lean_cpu.append(time.process_time() - cpu)
    matmul_tflops = matmul_flops / min(matmul_s) / 1e12
    pass_tflops = pass_flops / min(pass_s) / 1e12
    result = {
        "dtype": args.dtype, "threads": args.threads, "tokens": tokens, "pass_tflop": pass_flops / 1e12,
        "pass_s": min(pass_s), "pass_s_all": pass_s, "pass_tflops": pass_tflops,
        "matmul": f"{n}x{n}x{n}", "matmul_tflops": matmul_tflops,
        "matmul_tflops_all": [matmul_flops / s / 1e12 for s in matmul_s], "ratio": pass_tflops / matmul_tflops,
    }
    if lean is not None:
        result |= {"just_in_time_pass_s": min(lean_s), "just_in_time_pass_s_all": lean_s,
                   "just_in_time_speed_vs_resident": min(pass_s) / min(lean_s),
                   "pass_cpu_s_all": pass_cpu, "just_in_time_pass_cpu_s_all": lean_cpu,
                   "just_in_time_cpu_speed_vs_resident": min(pass_cpu) / min(lean_cpu)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"| body dtype | threads | tokens | pass TFLOP | pass s (best of {args.rounds}) | pass TFLOP/s "
          f"| {n}^3 matmul TFLOP/s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {args.dtype} | {args.threads} | {tokens} | {pass_flops / 1e12:.3f} | {min(pass_s):.2f} "
          f"| {pass_tflops:.3f} | {matmul_tflops:.3f} | {result['ratio']:.2f} |")
    if lean is not None:
        lean_tflops = pass_flops / min(lean_s) / 1e12
        print(f"| {args.dtype}, weights cast just in time | {args.threads} | {tokens} | {pass_flops / 1e12:.3f} "
              f"| {min(lean_s):.2f} | {lean_tflops:.3f} | {matmul_tflops:.3f} | {lean_tflops / matmul_tflops:.2f} |")
        print(f"\njust-in-time pass speed / resident pass speed: {result['just_in_time_speed_vs_resident']:.3f} "
              f"(wall), {result['just_in_time_cpu_speed_vs_resident']:.3f} (process CPU time: resident "
              f"{min(pass_cpu):.2f} s, just in time {min(lean_cpu):.2f} s)")


if __name__ == "__main__":
    main()
