"""The default --threads on a machine whose other work uses every core: a denoise of the demo model timed with the
default and with --threads 1 (and 2 threads with OpenMP's passive waiting, and the old default: every core), each in
a fresh process, while N busy processes (default: one per CPU) spin beside it.

    python benchmarks/threads_loaded.py [--busy N] [--steps 20] [--repeat 3]

Each figure is the median of --repeat runs of `anima-rknn generate --json` (its denoise_s and the process's CPU
time), the VAE on torch; the machine's load average is printed with the table. Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _spin() -> None:
    while True:
        pass


def run(settings: list[str], env: dict[str, str], steps: int, out: Path) -> tuple[float, float, int]:
    """denoise_s, the process's CPU seconds and the threads the run used, of one generate."""
    command = [sys.executable, "-m", "anima_rknn", "generate", "-p", "a red circle", "--steps",
               str(steps), "--vae-backend", "torch", "--json", "--overwrite", "-o", str(out), *settings]
    before = os.times()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    after = os.times()
    if done.returncode:
        raise SystemExit(done.stderr)
    summary = json.loads(done.stdout)
    return (summary["timings"]["denoise_s"], after.children_user + after.children_system - before.children_user
            - before.children_system, summary["threads"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    base = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    cores = os.cpu_count() or 1
    cases = {
        "--threads 1": (["--threads", "1"], base),
        "default (auto)": ([], base),
        f"--threads {cores}, OpenMP active waiting (the old default)": (["--threads", str(cores)],
                                                                          base | {"OMP_WAIT_POLICY": "ACTIVE"}),
        f"--threads {cores}, passive waiting": (["--threads", str(cores)], base),
    }
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    time.sleep(5)  # the load average climbs
    load_start = os.getloadavg()[0]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            for name, (settings, env) in cases.items():
                runs = [run(settings, env, args.steps, Path(folder) / "x.png") for _ in range(args.repeat)]
                rows.append((name, runs[0][2], statistics.median(r[0] for r in runs),
                             statistics.median(r[1] for r in runs)))
    finally:
        for process in busy:
            process.kill()
    flags = " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_bf16)\b",
                                           Path("/proc/cpuinfo").read_text()))))
    print(f"{cores} CPUs ({flags}), {args.busy} busy processes beside it, load average {load_start:.1f} at the "
          f"start, {os.getloadavg()[0]:.1f} at the end; {args.steps} steps, median of {args.repeat}\n")
    print("| threads | ran on | denoise s | CPU s | vs --threads 1 |\n| --- | --- | --- | --- | --- |")
    one = rows[0][2]
    for name, threads, denoise, cpu in rows:
        print(f"| {name} | {threads} | {denoise:.2f} | {cpu:.1f} | {denoise / one:.2f}x |")


if __name__ == "__main__":
    main()
