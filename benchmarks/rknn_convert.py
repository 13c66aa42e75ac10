"""Convert an exported subgraph set to .rknn and report time, sizes, predicted memory and simulator accuracy.

Run in .venv-rknn:
    .venv-rknn/bin/python benchmarks/rknn_convert.py SUBGRAPH_DIR OUT_DIR [--budget-gb 8] [--accuracy 3]
Accuracy compares the x86 simulator (fp16) with ONNX Runtime running the source ONNX in fp32, on random
inputs shaped like the engine's (RoPE inputs are cos/sin of random angles).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from anima_rknn.engine.backends.rknn import RknnBackend
from anima_rknn.engine.memory_plan import plan_memory, predict_memory, size
from anima_rknn.export.rknn import convert_subgraphs

ANIMA = {"hidden": 2048, "blocks": 28, "mlp": 8192}


def random_inputs(entry: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    inputs = {}
    for spec in entry["inputs"]:
        if spec["name"] in ("rope_cos", "rope_sin"):
            angles = np.random.default_rng(0).uniform(-np.pi, np.pi, spec["shape"])  # same for cos and sin
            inputs[spec["name"]] = (np.cos if spec["name"] == "rope_cos" else np.sin)(angles).astype(np.float32)
        else:
            inputs[spec["name"]] = rng.standard_normal(spec["shape"]).astype(np.float32)
    return inputs


def accuracy(rknn_dir: Path, manifest: dict, count: int) -> list[tuple[str, float, float]]:
    import onnxruntime

    source_dir = Path(manifest["rknn"]["source_dir"])
    rng = np.random.default_rng(0)
    backend = RknnBackend(rknn_dir, runtime="simulator", max_resident=1)
    rows = []
    try:
        for entry in manifest["subgraphs"][:count]:
            inputs = random_inputs(entry, rng)
            session = onnxruntime.InferenceSession(str(source_dir / entry["file"]), providers=["CPUExecutionProvider"])
            feed = {name: value.astype(spec["dtype"]) for (name, value), spec in zip(inputs.items(), entry["inputs"])}
            want = session.run(None, feed)[0].astype(np.float64).ravel()
            got = backend.run(entry["index"], inputs).astype(np.float64).ravel()
            cosine = float(got @ want / np.linalg.norm(got) / np.linalg.norm(want))
            rows.append((entry["file"], cosine, float(np.abs(got - want).max() / np.abs(want).max())))
    finally:
        backend.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("subgraph_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--budget-gb", type=float, default=8.0, help="board memory for the plan (decimal GB)")
    parser.add_argument("--accuracy", type=int, default=3, metavar="N", help="check the first N subgraphs")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    budget = round(args.budget_gb * 1e9)

    manifest_path = convert_subgraphs(args.subgraph_dir, args.out_dir, args.target)
    manifest = json.loads(manifest_path.read_text())
    records = manifest["rknn"]["subgraphs"]
    print("\n| subgraph | convert s | .rknn | weights | internal |\n|---|---:|---:|---:|---:|")
    for entry, record in zip(manifest["subgraphs"], records):
        print(f"| {entry['file']} | {record['convert_s']:.2f} | {size(record['rknn_bytes'])} | "
              f"{size(record.get('weight_bytes', 0))} | {size(record.get('internal_bytes', 0))} |")
    print(f"total convert time {sum(r['convert_s'] for r in records):.1f} s (skipped files keep their first time)")

    plans = {"this set": plan_memory(manifest, budget)}
    for tokens in (1024, 4096):
        plans[f"Anima, {tokens} tokens"] = predict_memory(tokens=tokens, budget_bytes=budget, **ANIMA)
    for title, plan in plans.items():
        print(f"\n## memory plan: {title}\n{plan.describe()}")

    rows = accuracy(args.out_dir, manifest, args.accuracy)
    print("\n| subgraph | cosine | max rel error |\n|---|---:|---:|")
    for name, cosine, rel_error in rows:
        print(f"| {name} | {cosine:.7f} | {rel_error:.2e} |")

    if args.json:
        args.json.write_text(json.dumps({
            "conversion": records,
            "plans": {title: {"max_resident": p.max_resident, "peak_bytes": p.peak_bytes,
                              "npu_peak_bytes": p.npu_peak_bytes, "loads_per_pass": p.loads_per_pass}
                      for title, p in plans.items()},
            "accuracy": [{"file": n, "cosine": c, "max_rel_error": e} for n, c, e in rows],
        }, indent=1))


if __name__ == "__main__":
    main()
