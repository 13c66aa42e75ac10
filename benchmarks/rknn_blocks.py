"""A DiT with Anima-2.9B's block count (40 blocks, 120 subgraphs) through every command, at the tiny preset's width:
make-tiny, the diffusers check, export-onnx, convert-rknn (all 120 subgraphs in rknn-toolkit2's simulator), plan,
verify-rknn and generate on torch, ONNX Runtime and the simulator, with each command's wall time and the images'
agreement. The CI test (tests/cli/test_make_tiny_blocks.py) runs the fast part of this; a 120-subgraph conversion is
too slow for CI, so it runs here, once, for docs/npu-board.md.

Run in the main environment; the rknn commands run in the toolkit's (--rknn-python):
    .venv/bin/python benchmarks/rknn_blocks.py --work /tmp/blocks40 [--blocks 40]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from anima_rknn.bench.metrics import psnr
from anima_rknn.core.files import cached_sha256
from anima_rknn.model.model_set import from_model_dir

ROOT = Path(__file__).resolve().parents[1]
SIZE = ["--width", "64", "--height", "64"]


def command(python: str, *args: str | Path) -> tuple[float, str]:
    """Run `anima-rknn args` with `python`; its wall seconds and stdout (a failure stops the benchmark)."""
    started = time.perf_counter()
    done = subprocess.run([python, "-m", "anima_rknn", *map(str, args)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"anima-rknn {' '.join(map(str, args))} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, done.stdout


def diffusers_error(dit_path: Path) -> float:
    """Relative error of our DiT against diffusers' CosmosTransformer3DModel with the file's weights."""
    sys.path.insert(0, str(ROOT / "tests"))
    from diffusers_reference import dit_file_error  # noqa: PLC0415 -- the tests' reference loader

    return dit_file_error(dit_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="the model, sets and images are kept here")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--rknn-python", default=str(ROOT.parent / "main" / ".venv-rknn" / "bin" / "python"),
                        help="the python of rknn-toolkit2's environment")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    work, main_python, rknn_python = args.work, sys.executable, args.rknn_python
    work.mkdir(parents=True, exist_ok=True)
    model, onnx32, onnx16, rknn = (work / name for name in ("set", "onnx", "onnx-fp16", "rknn"))
    seconds: dict[str, float] = {}
    if not model.exists():
        seconds["make-tiny"] = command(main_python, "make-tiny", "--out", model, "--blocks", args.blocks)[0]
    dit = from_model_dir(model).dit
    error = diffusers_error(dit)
    for out, dtype in ((onnx32, "fp32"), (onnx16, "fp16")):
        if not (out / "manifest.json").exists():
            seconds[f"export-onnx {dtype}"] = command(main_python, "export-onnx", "--model", model, *SIZE,
                                                      "--dtype", dtype, "--out", out)[0]
    if not (rknn / "manifest.json").exists():
        seconds["convert-rknn"] = command(rknn_python, "convert-rknn", "--subgraphs", onnx16, "--out", rknn)[0]
    seconds["plan"], plan = command(main_python, "plan", "--subgraphs", rknn, "--budget", "8GB")
    seconds["verify-rknn"], verify = command(rknn_python, "verify-rknn", "--model", model, "--subgraphs", rknn,
                                             "--rknn-runtime", "simulator")
    records = {}
    for name, python, backend in (
            ("torch", main_python, []), ("onnx", main_python, ["--backend", "onnx", "--subgraphs", onnx32]),
            ("rknn", rknn_python, ["--backend", "rknn", "--subgraphs", rknn, "--rknn-runtime", "simulator"])):
        seconds[f"generate {name}"], out = command(
            python, "generate", "--model", model, "-p", "a red circle", *SIZE, "--steps", "8", "--dtype", "fp32",
            *backend, "-o", work / f"{name}.png", "--json")
        records[name] = json.loads(out)
    images = {name: np.asarray(Image.open(work / f"{name}.png")) for name in records}
    result = {
        "blocks": args.blocks, "dit_sha256": cached_sha256(dit), "diffusers_relative_error": error,
        "seconds": seconds, "plan": plan.splitlines()[:2] + plan.splitlines()[-3:],
        "verify": verify.splitlines()[-3:],
        "subgraph_runs": {name: r["subgraph_runs"] for name, r in records.items()},
        "psnr_vs_torch": {name: psnr(images["torch"], images[name]) for name in ("onnx", "rknn")},
        "max_abs_vs_torch": {name: int(np.abs(images["torch"].astype(int) - images[name]).max())
                             for name in ("onnx", "rknn")},
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
