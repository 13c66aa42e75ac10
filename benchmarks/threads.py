"""--threads on this machine: the demo model's generate on torch at 1 / 2 / all threads (and twice the cores,
oversubscribed), and on the onnx backend (the demo DiT's exported set) with ONNX Runtime's pool spinning on (its
default) and off (ours), in one run; whether the pictures differ between thread counts.

    python benchmarks/threads.py [--steps 20] [--repeat 3]

Each figure is the median of --repeat runs (wall time and the process's CPU time) of one 64x64 demo image, fp32
bodies, the torch VAE, no cache; a run's model loading is outside the time (the pipeline is warmed up once per
setting). The machine's load average at the start and at the end is printed with the table: on a machine busy with
other work the threads compete with it, and that is the case the defaults are chosen for. Prints Markdown.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from anima_rknn import AnimaPipeline, GenerationParams, resolve_model
from anima_rknn.core import threads as thread_counts
from anima_rknn.engine.backends import onnx as onnx_backend
from anima_rknn.export.onnx import export_subgraphs


def cpu_label() -> str:
    text = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_bf16)\b", text)))) or "none of them"
    return f"{model.group(1) if model else 'unknown CPU'}, {os.cpu_count()} CPUs, flags {flags}"


def timed(pipeline: AnimaPipeline, params: GenerationParams, repeat: int) -> tuple[float, float, str]:
    """Median wall and CPU seconds of `repeat` runs after one untimed one, and the picture's sha256 (short)."""
    image = pipeline.generate(params).image  # warm-up: kernels, allocator, the ONNX sessions' first runs
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        image = pipeline.generate(params).image
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    digest = hashlib.sha256(np.asarray(image).tobytes()).hexdigest()[:12]
    return statistics.median(walls), statistics.median(cpus), digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    start_load = os.getloadavg()
    cores = os.cpu_count() or 1
    counts = sorted({1, 2, cores, 2 * cores})
    files = resolve_model(None)
    base = GenerationParams(prompt="a red circle on a blue field", width=64, height=64, steps=args.steps, seed=7,
                            dtype="fp32", vae_backend="torch")
    rows = []
    pipeline = AnimaPipeline(files, keep_dit=True)
    for count in counts:
        rows.append(("torch", count, "-", *timed(pipeline, GenerationParams(**{**vars(base), "threads": count}),
                                                 args.repeat)))
        print("measured", rows[-1], file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as folder:
        subgraphs = export_subgraphs(files.dit, 64, 64, Path(folder) / "set", progress=False).parent
        real = thread_counts.session_options
        for spinning in (True, False):
            # OnnxBackend's sessions, with ONNX Runtime's spinning pool (its default) or without (ours).
            onnx_backend.session_options = functools.partial(real, spinning=spinning)
            for count in counts:
                params = GenerationParams(**{**vars(base), "threads": count, "backend": "onnx",
                                             "subgraphs": subgraphs})
                rows.append(("onnx", count, "on" if spinning else "off",
                             *timed(AnimaPipeline(files, keep_dit=True), params, args.repeat)))
                print("measured", rows[-1], file=sys.stderr, flush=True)
        onnx_backend.session_options = real
    load = "; ".join(" / ".join(f"{x:.1f}" for x in loads) + f" at the {when}"
                     for when, loads in (("start", start_load), ("end", os.getloadavg())))
    print(f"{cpu_label()}; load average (1/5/15 min) {load}; demo model 64x64, {args.steps} steps, "
          f"fp32, median of {args.repeat}; auto here = {thread_counts.auto_threads()} threads\n")
    print("| backend | threads | ORT spinning | wall s | CPU s | wall vs 1 thread | picture (sha256) |")
    print("|---|---|---|---|---|---|---|")
    one = {(backend, spin): wall for backend, count, spin, wall, _, _ in rows if count == 1}
    for backend, count, spin, wall, cpu, digest in rows:
        print(f"| {backend} | {count} | {spin} | {wall:.2f} | {cpu:.2f} | {wall / one[backend, spin]:.2f}x | "
              f"`{digest}` |")
    spun = {count: wall for backend, count, spin, wall, _, _ in rows if spin == "on"}
    still = {count: wall for backend, count, spin, wall, _, _ in rows if spin == "off"}
    print("\nONNX Runtime spinning on / off, wall time: "
          + ", ".join(f"{count} threads {spun[count] / still[count]:.2f}x" for count in counts))


if __name__ == "__main__":
    main()
