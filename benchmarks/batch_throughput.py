"""`anima-rknn batch` against separate `generate` calls, and Ray with 1 vs 2 local workers: wall time per image.

    .venv/bin/python benchmarks/batch_throughput.py --model MID --size 256 --steps 4 --jobs 4 --ray-jobs 8

Every run is the real command in a fresh process, as a user runs it (interpreter start, imports and model loads
included), one after another on this machine:
- generate: `--jobs` separate `anima-rknn generate` calls (one prompt, seeds 1..N), wall time per image;
- batch: one `anima-rknn batch` over the same jobs (same images), wall per image, and the steady per-job time
  that results.jsonl records (job_s: encode + denoise + decode on the warm worker);
- ray 1 / ray 2: `anima-rknn batch --ray local --ray-workers W` over `--ray-jobs` jobs: jobs per hour, from the
  command's wall time (Ray's start and each worker's model load included).
Pass --skip-ray where Ray is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "anima_rknn"]


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(CLI + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(args[:1])} failed: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=4, help="jobs of the generate-vs-batch comparison")
    parser.add_argument("--ray-jobs", type=int, default=8, help="jobs of each Ray run")
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    common = ["--model", args.model, "-W", str(args.size), "-H", str(args.size), "--steps", str(args.steps)]
    work = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    (work / "prompt.txt").write_text("a cat\n")
    print(f"model {args.model}, {args.size}x{args.size}, {args.steps} steps; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {os.getloadavg()[0]:.1f}")
    print("| run | jobs | wall | per image | jobs/hour |")
    print("|---|---:|---:|---:|---:|")

    def row(name: str, jobs: int, wall: float) -> None:
        print(f"| {name} | {jobs} | {wall:.1f} s | {wall / jobs:.2f} s | {3600 * jobs / wall:,.0f} |", flush=True)

    separate = sum(timed(["generate", *common, "-p", "a cat", "--seed", str(seed), "-o", str(work / f"g{seed}.png")])
                   for seed in range(1, args.jobs + 1))
    row("generate, one call per image", args.jobs, separate)
    out = work / "batch"
    row("batch (local, model kept warm)", args.jobs,
        timed(["batch", str(work / "prompt.txt"), *common, "--seeds", f"1-{args.jobs}", "-o", str(out)]))
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    steady = [r["timings"]["job_s"] for r in records[1:]] or [records[0]["timings"]["job_s"]]
    print(f"\nbatch's own per-job time (results.jsonl job_s): first {records[0]['timings']['job_s']:.2f} s, "
          f"later mean {sum(steady) / len(steady):.2f} s")
    if args.skip_ray:
        return
    print()
    print("| run | jobs | wall | per image | jobs/hour |")
    print("|---|---:|---:|---:|---:|")
    for workers in (1, 2):
        row(f"batch --ray local, {workers} worker{'s' if workers > 1 else ''}", args.ray_jobs,
            timed(["batch", str(work / "prompt.txt"), *common, "--seeds", f"1-{args.ray_jobs}",
                   "-o", str(work / f"ray{workers}"), "--ray", "local", "--ray-workers", str(workers)]))


if __name__ == "__main__":
    main()
