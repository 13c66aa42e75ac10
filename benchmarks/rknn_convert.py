"""RKNN figures for the README: conversion time and .rknn sizes at full Anima width, predicted peak memory per
memory strategy for the full model, and the simulator's accuracy on real inputs.

A full 28-block DiT does not fit this machine's time budget, so one block of full width (hidden 2048, 16 heads,
MLP 8192, random weights) is exported and converted per resolution; its blocks are all alike, so the full
model's per-context figures are these three repeated 28 times. Memory then uses the compiler's own sizes
(its verbose build log). Accuracy: the simulator (fp16) against fp32 torch on the inputs one torch split pass
really feeds each subgraph (initial noise at sigma 1, a context drawn like the adapter's output).

Run in .venv-rknn (a few minutes per resolution on a small machine):
    .venv-rknn/bin/python benchmarks/rknn_convert.py --sizes 512 1024 [--budget 8GB] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import torch

from anima_rknn.engine.memory_plan import loads_per_pass, parse_size, plan_memory, size
from anima_rknn.engine.accuracy import capture_pass, verify_subgraphs
from anima_rknn.errors import AnimaError
from anima_rknn.export.onnx import export_subgraphs
from anima_rknn.export.rknn import convert_subgraphs
from anima_rknn.generation.pipeline import initial_noise
from anima_rknn.model.config import PRESETS
from anima_rknn.model.io import load_dit, random_dit, save_dit

FULL = PRESETS["full"]


def full_model_manifest(one_block: dict, blocks: int = FULL.blocks) -> dict:
    """The manifest of the full-width model of `blocks` blocks (Anima's 28 by default), each block carrying the
    converted block's compiler figures."""
    subgraphs, records = [], []
    for index in range(3 * blocks):
        entry, record = one_block["subgraphs"][index % 3], one_block["rknn"]["subgraphs"][index % 3]
        subgraphs.append({**entry, "index": index, "block": index // 3})
        records.append({**record, "index": index})
    return {**one_block, "model": {**one_block["model"], "blocks": blocks}, "subgraphs": subgraphs,
            "rknn": {**one_block["rknn"], "subgraphs": records}}


def strategies(manifest: dict, budget: int) -> list[tuple[str, int, int, int]]:
    """(strategy, peak bytes, NPU peak bytes, context loads per pass) for the ways through the memory limit."""
    plan = plan_memory(manifest, None)
    host, count = plan.host_bytes, len(plan.contexts)
    weights = sum(c.weight_bytes for c in plan.contexts)
    largest_activation = max(c.activation_bytes for c in plan.contexts)
    rows = [("all 84 contexts open", host + sum(c.total_bytes for c in plan.contexts),
             sum(c.npu_bytes for c in plan.contexts), 0),
            ("one context at a time", host + max(c.total_bytes for c in plan.contexts),
             max(c.npu_bytes for c in plan.contexts), loads_per_pass(count, 1))]
    try:
        bounded = plan_memory(manifest, budget)
        rows.append((f"{bounded.max_resident} resident ({bounded.max_resident - 1} pinned) in {size(budget)}",
                     bounded.peak_bytes, bounded.npu_peak_bytes, bounded.loads_per_pass))
    except AnimaError as e:  # a budget that cannot work is a result here, not a failure
        rows.append((f"bounded in {size(budget)}: {e}", 0, 0, 0))
    # librknnrt through ctypes (not implemented): weights mapped zero-copy, one shared activation buffer
    rows.append(("shared activation buffer (ctypes; prediction only)", host + weights + largest_activation,
                 weights + largest_activation, 0))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024], help="square image sizes")
    parser.add_argument("--budget", default="8GB", help="board memory for the bounded strategy")
    parser.add_argument("--work", type=Path, help="keep the exported and converted sets here")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    budget = parse_size(args.budget)
    torch.manual_seed(0)
    work = args.work or Path(tempfile.mkdtemp(prefix="rknn-bench-"))
    dit_path = work / "anima-one-block.safetensors"
    if not dit_path.exists():
        save_dit(random_dit(dataclasses.replace(FULL, blocks=1), seed=0), dit_path)
    dit = load_dit(dit_path, torch.float32)
    report = {}
    for side in args.sizes:
        onnx_dir, rknn_dir = work / f"onnx-{side}", work / f"rknn-{side}"
        if not (onnx_dir / "manifest.json").exists():
            export_subgraphs(dit_path, side, side, onnx_dir, progress=False, overwrite=True)
        one_block = json.loads(convert_subgraphs(onnx_dir, rknn_dir).read_text())
        print(f"\n## {side}x{side} ({one_block['tokens']} tokens)\n")
        print("| subgraph | convert s | .rknn | weights | activations (internal) |\n|---|---:|---:|---:|---:|")
        for record in one_block["rknn"]["subgraphs"]:
            print(f"| {record['rknn_file']} | {record['convert_s']:.1f} | {size(record['rknn_bytes'])} | "
                  f"{size(record['weight_bytes'])} | {size(record['internal_bytes'])} |")

        rows = strategies(full_model_manifest(one_block), budget)
        print("\nFull model (84 contexts), compiler figures:\n\n| strategy | predicted peak | NPU side | "
              "loads per pass |\n|---|---:|---:|---:|")
        for name, peak, npu, loads in rows:
            print(f"| {name} | {size(peak)} | {size(npu)} | {loads} |")

        context = torch.randn(1, FULL.context_tokens, FULL.context_dim)
        latent = torch.from_numpy(initial_noise(0, side, side))
        accuracy = verify_subgraphs(rknn_dir, capture_pass(dit, latent, 1.0, context), runtime="simulator")
        print("\n| subgraph | cosine | max rel error |\n|---|---:|---:|")
        for r in accuracy:
            print(f"| {r.file} | {r.cosine:.7f} | {r.max_rel_error:.2e} |")
        report[side] = {"conversion": one_block["rknn"]["subgraphs"],
                        "strategies": [dict(zip(("strategy", "peak_bytes", "npu_bytes", "loads_per_pass"), row))
                                       for row in rows],
                        "accuracy": [dataclasses.asdict(r) for r in accuracy]}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
