"""`serve --keep-models` against loading each stage per job: time per job and peak memory, in one run.

    .venv/bin/python benchmarks/server_keep_models.py --model MID --jobs 3 --size 256 --steps 4

Each mode runs in a fresh process (so peak RSS is its own): a JobQueue with the pipeline kept or not, `--jobs`
jobs queued at once, the wall time of each job from start to image, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

RUN = """
import json, resource, sys, tempfile, time
from pathlib import Path
from anima_rknn.model.model_set import resolve
from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.server.job_queue import JobQueue
model, keep = sys.argv[1], sys.argv[2] == "keep"
jobs, size, steps = (int(a) for a in sys.argv[3:6])
queue = JobQueue(AnimaPipeline(resolve(model), keep_dit=keep), Path(tempfile.mkdtemp()) / "data")
queue.start()
times = []
for i in range(jobs):
    start = time.perf_counter()
    job = queue.submit(GenerationParams(prompt="a cat", width=size, height=size, steps=steps, seed=i))
    job.done.wait()
    assert job.state == "completed", job.error
    times.append(time.perf_counter() - start)
queue.close()
print(json.dumps({"times": times, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    print("| mode | first job | later jobs (mean) | peak RSS |")
    print("|---|---:|---:|---:|")
    for mode in ("keep", "per-stage"):
        done = subprocess.run([sys.executable, "-c", RUN, args.model, mode, str(args.jobs), str(args.size),
                               str(args.steps)], capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        later = result["times"][1:] or result["times"]
        print(f"| {mode} | {result['times'][0]:.2f} s | {sum(later) / len(later):.2f} s | "
              f"{result['peak_mib']:,.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
