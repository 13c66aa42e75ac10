"""The README's `bench` figures: cached vs baseline on the mid random model set (CPU, torch backend, 512x512,
20 steps, defaults otherwise) and, for the same 20 steps, the Gaussian-mixture test bed's exact model.

    python benchmarks/bench_figures.py --out /tmp/bench-figures [--repeat 3] [--seeds 20260812] [--testbed-seeds 100]

Writes the mid model set and the bench's folder under --out, and prints the Markdown for the README: the command
lines, the bench's report.md and the test-bed table.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from spectrum_testbed import markdown as testbed_markdown
from spectrum_testbed import measure as measure_testbed

CLI = str(Path(sys.executable).with_name("anima-rknn"))
CACHES = "spectrum,spectrum-plus,reuse"
PROMPT = "a cute anime girl standing in a flower field, masterpiece, best quality"


def run(command: list[str]) -> str:
    shown = shlex.join(["anima-rknn", *command[1:]])
    print(f"$ {shown}", file=sys.stderr)
    subprocess.run(command, check=True)
    return shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the model set and the bench report")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side (times: min and median)")
    parser.add_argument("--seeds", default="20260812", help="comma list of seeds for the mid model")
    parser.add_argument("--testbed-seeds", type=int, default=100, help="noise seeds per test-bed mixture")
    args = parser.parse_args()

    models, report_dir = args.out / "mid", args.out / "bench-mid"
    commands = []
    if not (models / "split_files").is_dir():
        commands.append(run([CLI, "make-tiny", "--preset", "mid", "--out", str(models)]))
    commands.append(run([CLI, "bench", "--model", str(models), "--prompt", PROMPT, "--cache", CACHES,
                         "--seeds", args.seeds, "--repeat", str(args.repeat), "--out", str(report_dir),
                         "--overwrite"]))
    rows = measure_testbed([20], args.testbed_seeds, dim=64, testbed_seed=0)

    print("```\n" + "\n".join(commands) + "\n```\n")
    # Two heading levels down, to sit under a README section.
    print((report_dir / "report.md").read_text().replace("# ", "### ", 1).replace("\n## ", "\n#### "))
    print(f"\n```\npython benchmarks/spectrum_testbed.py --steps 20 --seeds {args.testbed_seeds}\n```\n")
    print(testbed_markdown(rows, args.testbed_seeds, 64))


if __name__ == "__main__":
    main()
