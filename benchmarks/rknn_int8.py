"""Quantized (w8a8) RKNN sets of the trained demo model in rknn-toolkit2's x86 simulator: which algorithm, whether
one static calibration holds across sigmas, which fallback threshold, and the effect on whole images.

Sections (all by default), each printing Markdown tables for docs/measurements/npu-int8.md:

- algorithms: every subgraph quantized whole (no fallback) with normal, mmse and kl_divergence; its worst and mean
  cosine against fp32 on the held-out run, per subgraph kind, and the conversion time.
- sigmas: the static calibration's held-out cosine per captured step (sigma), and per-sigma calibrations (early
  steps only, late steps only) checked on the held-out passes of their own steps.
- layers: for a few subgraphs, which layers kept fp16 (the toolkit's hybrid quantization) recover the held-out
  cosine: the attention core, the output projection and output, both.
- fullwidth (not by default: slow): the residency table, from one full-width block per size (see full_width).
- fullwidth-memory (not by default): the w8a8 and hybrid compiler figures of the full-width block at the last of
  --sides from a one-pass calibration, no held-out check (see fullwidth_memory).
- residency: plans of 28- and 40-block full-width models from fullwidth's converted sets (no conversion).
- images: prompts and seeds the calibration never saw (the demo reader's prompt set, seed 7, noise seeds 1000 + i),
  sampled Euler 20 steps CFG 4 with the fp32 torch bodies, the fp16 set and w8a8 sets at several thresholds, all in
  the simulator with every context resident; PSNR against fp32 torch and against the fp16 set, the demo reader's
  adherence, and the per-subgraph table of the default set.
- mid (not by default): the images and per-subgraph tables on make-tiny's mid preset (random weights, hidden 512),
  --mid-blocks blocks at --mid-side pixels, calibrated and compared on its own prompts and seeds (see mid).

Calibration: 8 prompts of the demo's caption grammar (prompt seed 11), the 9th held out, noise seeds 0..8,
20 steps, 5 captured, both CFG branches. Run in .venv-rknn (about 15 minutes on 2 cores):
    .venv-rknn/bin/python benchmarks/rknn_int8.py --work /tmp/int8 [--sections algorithms sigmas images]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from anima_rknn.demo.dataset import IMAGE_SIZE
from anima_rknn.demo.evaluate import adherence, judge, prompt_set
from anima_rknn.engine.backends.rknn import RknnBackend
from anima_rknn.engine.backends.torch import TorchBackend
from anima_rknn.engine.calibrate import CalibrationRun, capture_calibration, euler_cfg
from anima_rknn.engine.split import SplitEngine
from anima_rknn.export.calibration import agreement, read_calibration
from anima_rknn.export.manifest import SUBGRAPH_KINDS, read_manifest
from anima_rknn.export.onnx import export_subgraphs
from anima_rknn.export.rknn import Quantization, convert_subgraphs, toolkit, toolkit_output
from anima_rknn.generation.pipeline import AnimaPipeline, initial_noise
from anima_rknn.model.io import load_dit
from anima_rknn.model.model_set import resolve
from anima_rknn.sampling.schedule import flow_sigmas

STEPS, CFG = 20, 4.0
ALL_INT8 = 1e-9  # a threshold every subgraph meets: quantized whole, no fallback
THRESHOLDS = (0.999, 0.995)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two 8-bit images (inf when identical); .venv-rknn has no scikit-image for bench.metrics'."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def runs(pipeline: AnimaPipeline, captions: list[str], seed: int, side: int = IMAGE_SIZE) -> list[CalibrationRun]:
    out = []
    for i, caption in enumerate(captions):
        c = pipeline.encode(caption, "")
        out.append(CalibrationRun(caption, seed + i, initial_noise(seed + i, side, side), c.positive, c.negative))
    return out


def convert(work: Path, name: str, onnx: Path, quantization: Quantization | None) -> tuple[Path, float]:
    """The set converted into work/name (kept between runs); its conversion's seconds, from its manifest."""
    out = work / name
    if not (out / "manifest.json").exists():
        convert_subgraphs(onnx, out, progress=False, quantization=quantization)
    return out, sum(r["convert_s"] for r in read_manifest(out)["rknn"]["subgraphs"])


def kind_rows(records: list[dict], precision: str) -> dict[str, tuple[float, float]]:
    """(worst, mean) held-out cosine per subgraph kind."""
    rows = {}
    for kind in SUBGRAPH_KINDS:
        values = [r["held_out_cosine"][precision] for i, r in enumerate(records) if i % 3 == SUBGRAPH_KINDS.index(kind)]
        rows[kind] = (min(values), float(np.mean(values)))
    return rows


def algorithms(work: Path, onnx: Path, calibration, report: dict) -> None:
    print("\n### Algorithms (every subgraph w8a8, held-out worst / mean cosine against fp32)\n")
    print("| algorithm | self_attn | cross_attn | mlp | convert s |\n|---|---|---|---|---:|")
    for algorithm in ("normal", "mmse", "kl_divergence"):
        out, seconds = convert(work, f"w8a8-all-{algorithm}", onnx,
                               Quantization("w8a8", algorithm, ALL_INT8, calibration))
        records = read_manifest(out)["rknn"]["subgraphs"]
        rows = kind_rows(records, "w8a8")
        report.setdefault("algorithms", {})[algorithm] = {"kinds": rows, "convert_s": seconds}
        cells = " | ".join(f"{w:.5f} / {m:.5f}" for w, m in rows.values())
        print(f"| {algorithm} | {cells} | {seconds:.0f} |")


def _build(onnx_path: Path, dataset: Path) -> object:
    rknn_class, _ = toolkit()
    rknn = rknn_class(verbose=False)
    rknn.config(target_platform="rk3588", quantized_dtype="w8a8", quantized_algorithm="normal",
                quantized_method="channel")
    rknn.load_onnx(model=str(onnx_path))
    rknn.build(do_quantization=True, dataset=str(dataset))
    rknn.init_runtime(target=None)
    return rknn


def sigmas(work: Path, onnx: Path, calibration, report: dict) -> None:
    """Static vs per-sigma calibration: mean held-out cosine per captured step, per subgraph kind."""
    source = read_manifest(onnx)
    samples = calibration.samples
    steps = sorted({s.step for s in samples})
    early, late = steps[: len(steps) // 2], steps[len(steps) // 2:]
    groups = {"static (all steps)": steps, f"early only {early}": early, f"late only {late}": late}
    table: dict[str, dict[str, dict[int, float]]] = {}
    for entry in source["subgraphs"]:
        folder = calibration.dataset(entry["index"]).parent
        names = [spec["name"] for spec in entry["inputs"]]
        held = list(calibration.held_out(entry))
        for label, kept in groups.items():
            lines = [" ".join(f"{i:03d}_{n}.npy" for n in names) for i, s in enumerate(samples)
                     if not s.held_out and s.step in kept]
            dataset = folder / f"bench-{abs(hash(label))}.txt"
            dataset.write_text("\n".join(lines) + "\n")
            with toolkit_output(), tempfile.TemporaryDirectory() as scratch:
                cwd = os.getcwd()
                os.chdir(scratch)
                try:
                    rknn = _build(onnx / entry["file"], dataset)
                    for sample, inputs, want in held:
                        if sample.step in kept:
                            got = rknn.inference(inputs=inputs, data_format=["nchw"] * len(inputs))[0]
                            cosine = agreement(np.asarray(got).reshape(want.shape), want)[0]
                            table.setdefault(label, {}).setdefault(entry["kind"], {}).setdefault(
                                sample.step, []).append(cosine)
                    rknn.release()
                finally:
                    os.chdir(cwd)
            dataset.unlink()
    sigma_of = {s.step: s.sigma for s in samples}
    print("\n### Calibration across sigmas (held-out run, mean cosine against fp32 over blocks and branches)\n")
    print("| calibrated on | kind | " + " | ".join(f"step {k} (sigma {sigma_of[k]:.2f})" for k in steps) + " |")
    print("|---|---|" + "---:|" * len(steps))
    for label, kinds in table.items():
        for kind, per_step in kinds.items():
            cells = " | ".join(f"{np.mean(per_step[k]):.5f}" if k in per_step else "" for k in steps)
            print(f"| {label} | {kind} | {cells} |")
    report["sigmas"] = {label: {kind: {str(k): float(np.mean(v)) for k, v in per.items()}
                                for kind, per in kinds.items()} for label, kinds in table.items()}


def sample_images(pipeline: AnimaPipeline, dit, backend, eval_runs: list[CalibrationRun]) -> list[np.ndarray]:
    engine = SplitEngine(dit, backend)
    images = []
    try:
        for run in eval_runs:
            latent = euler_cfg(engine, run, flow_sigmas(STEPS), CFG)
            images.append(np.asarray(pipeline.decode(latent)[0]))
    finally:
        engine.close()
    return images


def threshold_sets(work: Path, onnx: Path, calibration, prefix: str = "",
                   thresholds: tuple[float, ...] = (ALL_INT8, *THRESHOLDS)) -> dict[str, Path | None]:
    """fp32 torch (None), the fp16 set and a w8a8 set per fallback threshold, converted into work (kept)."""
    sets: dict[str, Path | None] = {"fp32 torch": None, "fp16 set": convert(work, f"{prefix}fp16", onnx, None)[0]}
    for threshold in thresholds:
        label = "w8a8 whole" if threshold == ALL_INT8 else f"w8a8, fallback below {threshold}"
        name = "w8a8-all-normal" if threshold == ALL_INT8 else f"w8a8-{threshold:g}"
        sets[label] = convert(work, prefix + name, onnx, Quantization("w8a8", "normal", threshold, calibration))[0]
    return sets


def compare_sets(pipeline: AnimaPipeline, dit, sets: dict[str, Path | None], eval_runs: list[CalibrationRun],
                 specs=None) -> dict[str, dict]:
    """Each set's images of `eval_runs`: PSNR against fp32 torch's and the fp16 set's, the demo reader's adherence
    when `specs` (the demo's prompts) are given, and the set's subgraph count per precision."""
    pictures, rows = {}, {}
    for label, folder in sets.items():
        backend = TorchBackend(dit, torch.float32) if folder is None else RknnBackend(folder, runtime="simulator")
        started = time.perf_counter()
        pictures[label] = sample_images(pipeline, dit, backend, eval_runs)
        counts = {} if folder is None else {
            p: sum(r.get("precision", "float16") == p for r in read_manifest(folder)["rknn"]["subgraphs"])
            for p in ("w8a8", "hybrid", "float16")}
        rows[label] = {"counts": counts, "seconds": time.perf_counter() - started,
                       "adherence": adherence(judge(specs, pictures[label])) if specs else None,
                       "psnr_fp32": [psnr(a, b) for a, b in zip(pictures["fp32 torch"], pictures[label])],
                       "psnr_fp16": [psnr(a, b) for a, b in zip(pictures.get("fp16 set", pictures[label]),
                                                                 pictures[label])]}
    return rows


def print_images(rows: dict[str, dict], title: str, report: dict, key: str) -> None:
    print(f"\n### {title}\n")
    print("| set | w8a8 / hybrid / fp16 subgraphs | PSNR vs fp32 torch mean / worst | PSNR vs fp16 set mean / worst "
          "| adherence (all attributes) |\n|---|---|---:|---:|---:|")
    for label, row in rows.items():
        counts = " / ".join(str(row["counts"][p]) for p in ("w8a8", "hybrid", "float16")) if row["counts"] else "-"
        cells = []
        for metric in ("psnr_fp32", "psnr_fp16"):
            finite = [v for v in row[metric] if np.isfinite(v)]
            cells.append(f"{np.mean(finite):.2f} / {min(finite):.2f}" if finite else "identical")
        judged = f"{row['adherence'].get('all', 0):.3f}" if row["adherence"] is not None else "-"
        print(f"| {label} | {counts} | {cells[0]} | {cells[1]} | {judged} |")
    report[key] = {k: {**v, "psnr_fp32": [float(x) for x in v["psnr_fp32"]],
                       "psnr_fp16": [float(x) for x in v["psnr_fp16"]]} for k, v in rows.items()}


def print_per_subgraph(sets: dict[str, Path | None]) -> None:
    """The default set's subgraphs: held-out worst cosine per precision tried, kept precision, and the weight size
    of the subgraph quantized whole (the w8a8-whole set's record) over its fp16 twin's."""
    default = read_manifest(sets["w8a8, fallback below 0.999"])["rknn"]["subgraphs"]
    whole = read_manifest(sets["w8a8 whole"])["rknn"]["subgraphs"]
    fp16 = read_manifest(sets["fp16 set"])["rknn"]["subgraphs"]
    print("\n### Per subgraph (held-out worst cosine against fp32; the default threshold 0.999)\n")
    print("| subgraph | w8a8 | hybrid | fp16 | kept | weights w8a8 / fp16 |\n|---|---:|---:|---:|---|---:|")
    for record, int8, half in zip(default, whole, fp16):
        cos = record["held_out_cosine"]
        cells = " | ".join(f"{cos[p]:.5f}" if p in cos else "-" for p in ("w8a8", "hybrid", "float16"))
        print(f"| {record['rknn_file']} | {cells} | {record['precision']} | "
              f"{int8.get('weight_bytes', 0) / max(half.get('weight_bytes', 1), 1):.2f} |")


def images(work: Path, onnx: Path, calibration, files, pipeline: AnimaPipeline, report: dict, count: int) -> None:
    calibration_prompts = {s.prompt for s in calibration.samples}
    specs = [s for s in prompt_set(24, seed=7) if s.caption not in calibration_prompts][:count]
    sets = threshold_sets(work, onnx, calibration)
    rows = compare_sets(pipeline, load_dit(files.dit, torch.float32), sets,
                        runs(pipeline, [s.caption for s in specs], 1000), specs)
    print_images(rows, f"Images ({len(specs)} prompts and seeds the calibration never saw, {STEPS} steps, CFG {CFG})",
                 report, "images")
    print_per_subgraph(sets)


def mid(work: Path, report: dict, blocks: int, side: int, count: int) -> None:
    """The image table on make-tiny's mid preset (hidden 512, random weights) with `blocks` blocks at side x side:
    calibrated on 4 prompts (a 5th held out), compared on `count` other prompts and seeds (noise seeds 1000 + i);
    no adherence (a random model draws nothing the demo reader knows)."""
    from anima_rknn.demo.tiny_set import write_model_set
    from anima_rknn.model.model_set import from_model_dir

    model = work / f"mid-{blocks}blocks"
    files = from_model_dir(model) if model.exists() else write_model_set(model, "mid", blocks=blocks)
    pipeline = AnimaPipeline(files, keep_dit=True)
    dit = load_dit(files.dit, torch.float32)
    onnx = work / f"mid-onnx-{blocks}-{side}"
    if not (onnx / "manifest.json").exists():
        export_subgraphs(files.dit, side, side, onnx, progress=False, overwrite=True)
    source = read_manifest(onnx)
    calibration_dir = work / f"mid-calibration-{blocks}-{side}"
    captions = [s.caption for s in prompt_set(5 + count, seed=11)]
    if not (calibration_dir / "calibration.json").exists():
        capture_calibration(dit, source, calibration_dir, runs(pipeline, captions[:5], 0, side), steps=STEPS,
                            cfg=CFG, overwrite=True, progress=False)
    calibration = read_calibration(calibration_dir, source)
    sets = threshold_sets(work, onnx, calibration, prefix=f"mid-{blocks}-{side}-", thresholds=(ALL_INT8, 0.999))
    rows = compare_sets(pipeline, dit, sets, runs(pipeline, captions[5:], 1000, side))
    print_images(rows, f"Mid random set, {blocks} blocks, {side}x{side} ({count} prompts and seeds the calibration "
                 f"never saw, {STEPS} steps, CFG {CFG})", report, f"mid-{blocks}-{side}")
    print_per_subgraph(sets)


def full_width(work: Path, report: dict, sides: list[int], budget: str, derive: list[int]) -> None:
    """One full-width block (random weights) per size, converted fp16 and w8a8 whole: the compiler's figures,
    repeated over 28 blocks (benchmarks/rknn_convert.py's full_model_manifest), planned under `budget`; each size of
    `derive` planned from the measured one's figures (derived_block)."""
    import dataclasses
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rknn_convert import full_model_manifest  # noqa: PLC0415 -- a sibling benchmark's helper

    from anima_rknn.engine.memory_plan import parse_size, plan_memory, size
    from anima_rknn.model.config import PRESETS
    from anima_rknn.model.io import random_dit, save_dit

    full = PRESETS["full"]
    dit_path = work / "full-one-block.safetensors"
    if not dit_path.exists():
        save_dit(random_dit(dataclasses.replace(full, blocks=1), seed=0), dit_path)
    dit = load_dit(dit_path, torch.float32)
    print(f"\n### Full width, one random block repeated over {full.blocks} (compiler figures), budget {budget}\n")
    print("| size | precision | weights self / cross / mlp | activations self / cross / mlp | .rknn self / cross / mlp "
          "| held-out worst cosine | resident of 84 | loads per pass | predicted peak |")
    print("|---|---|---|---|---|---|---:|---:|---:|")
    for side in sides:
        onnx = work / f"full-onnx-{side}"
        if not (onnx / "manifest.json").exists():
            export_subgraphs(dit_path, side, side, onnx, progress=False, overwrite=True)
        source = read_manifest(onnx)
        calibration_dir = work / f"full-calibration-{side}"
        if not (calibration_dir / "calibration.json").exists():
            generator = torch.Generator().manual_seed(side)
            shape = (1, full.context_tokens, full.context_dim)
            contexts = [torch.randn(shape, generator=generator) for _ in range(4)]
            full_runs = [CalibrationRun(f"random context {i}", i, initial_noise(i, side, side), contexts[2 * i],
                                        contexts[2 * i + 1]) for i in range(2)]
            capture_calibration(dit, source, calibration_dir, full_runs, steps=4, captured=2, overwrite=True,
                                progress=False)
        calibration = read_calibration(calibration_dir, source)
        for name, label, quantization in (
                ("fp16", "fp16", None), ("w8a8", "w8a8 whole", Quantization("w8a8", "normal", ALL_INT8, calibration)),
                ("w8a8-0.999", "w8a8, fallback below 0.999", Quantization("w8a8", "normal", 0.999, calibration))):
            out, _ = convert(work, f"full-{name}-{side}", onnx, quantization)
            one = read_manifest(out)
            records = one["rknn"]["subgraphs"]
            plan = plan_memory(full_model_manifest(one), parse_size(budget))
            cells = [" / ".join(size(r[key]) for r in records) for key in ("weight_bytes", "internal_bytes",
                                                                            "rknn_bytes")]
            cosine = " / ".join(f"{r['held_out_cosine'][r['precision']]:.5f} {r['precision']}"
                                if "held_out_cosine" in r else "-" for r in records)
            print(f"| {side}x{side} | {label} | {' | '.join(cells)} | {cosine} | {plan.max_resident} | "
                  f"{plan.loads_per_pass} | {size(plan.peak_bytes)} |")
            report.setdefault("full_width", {})[f"{label}-{side}"] = {
                "records": records, "resident": plan.max_resident, "loads_per_pass": plan.loads_per_pass,
                "peak_bytes": plan.peak_bytes}
            for derived in derive:
                scaled = derived_block(work, dit_path, one, derived)
                plan = plan_memory(full_model_manifest(scaled), parse_size(budget))
                print(f"| {derived}x{derived} (derived) | {label} | {cells[0]} | "
                      f"{' / '.join(size(r['internal_bytes']) for r in scaled['rknn']['subgraphs'])} | "
                      f"{cells[2]} | - | {plan.max_resident} | {plan.loads_per_pass} | {size(plan.peak_bytes)} |")


def residency(work: Path, report: dict, sides: list[int], budget: str, models: tuple[int, ...] = (28, 40)) -> None:
    """The plan under `budget` of full-width models of 28 blocks (Anima 2B) and 40 (the Anima-2.9B shape) from the
    full-width block's sets that fullwidth converted (every block carrying that block's compiler figures)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rknn_convert import full_model_manifest  # noqa: PLC0415 -- a sibling benchmark's helper

    from anima_rknn.engine.memory_plan import parse_size, pinned_contexts, plan_memory, size

    print(f"\n### Residency under {budget}, from the converted full-width block's compiler figures\n")
    print("| size | precision | blocks (contexts) | resident (pinned) | loads per pass | predicted peak | NPU peak |")
    print("|---|---|---|---|---:|---:|---:|")
    for side in sides:
        for name, label in (("fp16", "fp16"), ("w8a8", "w8a8 whole"), ("w8a8-0.999", "w8a8, fallback below 0.999")):
            folder = work / f"full-{name}-{side}"
            if not (folder / "manifest.json").exists():
                continue
            one = read_manifest(folder)
            for blocks in models:
                plan = plan_memory(full_model_manifest(one, blocks), parse_size(budget))
                print(f"| {side}x{side} | {label} | {blocks} ({3 * blocks}) | {plan.max_resident} "
                      f"({pinned_contexts(3 * blocks, plan.max_resident)}) | "
                      f"{plan.loads_per_pass} | {size(plan.peak_bytes)} | {size(plan.npu_peak_bytes)} |")
                report.setdefault("residency", {})[f"{label}-{side}-{blocks}"] = {
                    "resident": plan.max_resident, "loads_per_pass": plan.loads_per_pass,
                    "peak_bytes": plan.peak_bytes, "npu_peak_bytes": plan.npu_peak_bytes}


class _OneSample:
    """A calibration set's first calibrating pass alone, as hybrid_step1 reads a calibration (dataset(index))."""

    def __init__(self, calibration) -> None:
        self.calibration = calibration

    def dataset(self, index: int) -> Path:
        full = self.calibration.dataset(index)
        one = full.with_name("bench-one-sample.txt")
        one.write_text(full.read_text().splitlines()[0] + "\n")
        return one


def fullwidth_memory(work: Path, report: dict, side: int, budget: str) -> None:
    """The w8a8 and hybrid compiler figures of the full-width block at side x side, measured from a build calibrated
    on one pass (the figures do not depend on the calibrated ranges; no held-out check: fullwidth's full conversion
    did not finish here at 1024x1024), planned with 512x512's precision choice per subgraph kind."""
    import sys

    from anima_rknn.export.rknn import _hybrid, compiler_memory, hybrid_step1, log_text, quantized_model

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rknn_convert import full_model_manifest  # noqa: PLC0415 -- a sibling benchmark's helper

    from anima_rknn.engine.memory_plan import parse_size, pinned_contexts, plan_memory, size

    onnx = work / f"full-onnx-{side}"
    source = read_manifest(onnx)
    quantization = Quantization("w8a8", "normal", ALL_INT8,
                                _OneSample(read_calibration(work / f"full-calibration-{side}", source)))
    measured: dict[str, dict[int, dict]] = {"w8a8": {}, "hybrid": {}}
    for entry in source["subgraphs"]:
        with tempfile.TemporaryDirectory() as scratch:
            cwd = os.getcwd()
            os.chdir(scratch)
            try:
                started = time.perf_counter()
                step1 = hybrid_step1(onnx / entry["file"], entry["index"], quantization, "rk3588")
                step1_s = time.perf_counter() - started
                for precision, sources in (("w8a8", step1), ("hybrid", _hybrid(step1))):
                    started = time.perf_counter()
                    with toolkit_output() as log:
                        rknn = quantized_model(sources, log, verbose=True)
                        rknn.export_rknn(f"{precision}.rknn")
                        rknn.release()
                        memory = compiler_memory(log_text(log))
                    measured[precision][entry["index"]] = {
                        **memory, "rknn_bytes": Path(f"{precision}.rknn").stat().st_size, "step1_s": step1_s,
                        "build_s": time.perf_counter() - started}
                    print(f"{entry['file']} {precision}: {measured[precision][entry['index']]}", flush=True)
            finally:
                os.chdir(cwd)
    fp16 = read_manifest(work / f"full-fp16-{side}")
    chosen = [r["precision"] for r in read_manifest(work / "full-w8a8-0.999-512")["rknn"]["subgraphs"]]
    rows = {"fp16": fp16["rknn"]["subgraphs"],
            "w8a8 whole": [{**r, **measured["w8a8"][i]} for i, r in enumerate(fp16["rknn"]["subgraphs"])],
            "w8a8, 512's fallback choice": [r if p == "float16" else {**r, **measured[p][i]}
                                            for i, (r, p) in enumerate(zip(fp16["rknn"]["subgraphs"], chosen))]}
    print(f"\n### {side}x{side} measured (one-pass calibration), planned under {budget}\n")
    print("| precision | weights self / cross / mlp | activations self / cross / mlp | .rknn self / cross / mlp "
          "| 28 blocks: resident (pinned) / loads per pass / peak | 40 blocks: resident (pinned) / loads per pass "
          "/ peak |\n|---|---|---|---|---|---|")
    for label, records in rows.items():
        one = {**fp16, "rknn": {**fp16["rknn"], "subgraphs": records}}
        cells = [" / ".join(size(r[key]) for r in records) for key in ("weight_bytes", "internal_bytes",
                                                                        "rknn_bytes")]
        plans = []
        for blocks in (28, 40):
            plan = plan_memory(full_model_manifest(one, blocks), parse_size(budget))
            plans.append(f"{plan.max_resident} ({pinned_contexts(3 * blocks, plan.max_resident)}) / "
                         f"{plan.loads_per_pass} / {size(plan.peak_bytes)}")
            report.setdefault("fullwidth_memory", {})[f"{label}-{blocks}"] = {
                "resident": plan.max_resident, "loads_per_pass": plan.loads_per_pass, "peak_bytes": plan.peak_bytes}
        print(f"| {label} | {' | '.join(cells)} | {' | '.join(plans)} |")
    report.setdefault("fullwidth_memory", {})["measured"] = measured


def derived_block(work: Path, dit_path: Path, one: dict, side: int) -> dict:
    """The block `one` (converted at another size) at side x side: its weights and files as measured, each
    subgraph's activations scaled by how the fp16 block's grew between the two sizes (converted here: fp16 needs
    no calibration), which for self-attention is more than the tokens."""
    onnx = work / f"full-onnx-{side}"
    if not (onnx / "manifest.json").exists():
        export_subgraphs(dit_path, side, side, onnx, progress=False, overwrite=True)
    there = read_manifest(convert(work, f"full-fp16-{side}", onnx, None)[0])["rknn"]["subgraphs"]
    here = read_manifest(work / f"full-fp16-{one['width']}")["rknn"]["subgraphs"]
    records = [{**r, "internal_bytes": round(r["internal_bytes"] * big["internal_bytes"] / small["internal_bytes"])}
               for r, big, small in zip(one["rknn"]["subgraphs"], there, here)]
    return {**one, "width": side, "height": side, "tokens": (side // 16) ** 2,
            "rknn": {**one["rknn"], "subgraphs": records}}


def layers(work: Path, onnx: Path, calibration, report: dict, indices: list[int]) -> None:
    """Which layers kept fp16 recover a subgraph: the toolkit's step 1 once, then step 2 with each choice, checked
    on the held-out passes (worst / mean cosine)."""
    from anima_rknn.export.rknn import hybrid_step1, quantized_model

    source = read_manifest(onnx)
    quantization = Quantization("w8a8", "normal", ALL_INT8, calibration)
    print("\n### Layers kept fp16 (held-out worst / mean cosine against fp32)\n")
    choices = {"none (w8a8)": lambda n: False, "attention core": lambda n: "sdpa" in n,
               "output projection + output": lambda n: n.startswith("y_"),
               "both (the hybrid rule)": lambda n: n.startswith("y_") or "sdpa" in n}
    print("| subgraph | " + " | ".join(choices) + " |\n|---|" + "---:|" * len(choices))
    for index in indices:
        entry = source["subgraphs"][index]
        held = list(calibration.held_out(entry))
        cells = []
        with tempfile.TemporaryDirectory() as scratch:
            cwd = os.getcwd()
            os.chdir(scratch)
            try:
                step1 = hybrid_step1(onnx / entry["file"], index, quantization, "rk3588")
                text = step1[2].read_text()
                names = re.findall(r"^    (\S+):$", text, re.MULTILINE)
                for label, keep in choices.items():
                    kept = [n for n in names if keep(n)]
                    if not kept and label != "none (w8a8)":
                        cells.append("-")
                        continue
                    cfg = Path(scratch) / "choice.quantization.cfg"
                    listed = "".join(f"\n    {n}: float16" for n in kept)
                    cfg.write_text(text.replace("custom_quantize_layers: {}", f"custom_quantize_layers:{listed}", 1)
                                   if kept else text)
                    with toolkit_output() as log:
                        rknn = quantized_model((step1[0], step1[1], cfg), log)
                        rknn.init_runtime(target=None)
                        cosines = [agreement(np.asarray(rknn.inference(inputs=inputs, data_format=["nchw"] * len(
                            inputs))[0]).reshape(want.shape), want)[0] for _, inputs, want in held]
                        rknn.release()
                    cells.append(f"{min(cosines):.5f} / {np.mean(cosines):.5f}")
            finally:
                os.chdir(cwd)
        report.setdefault("layers", {})[entry["file"]] = cells
        print(f"| {Path(entry['file']).stem} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="sets, calibration and results are kept here")
    parser.add_argument("--sections", nargs="+", default=["algorithms", "layers", "sigmas", "images"])
    parser.add_argument("--images", type=int, default=8, help="evaluation prompts")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--sides", type=int, nargs="+", default=[512, 1024], help="fullwidth: image sizes")
    parser.add_argument("--budget", default="8GB", help="fullwidth: the board's memory for the plan")
    parser.add_argument("--derive", type=int, nargs="*", default=[],
                        help="fullwidth: sizes planned from --sides' quantized figures (see derived_block)")
    parser.add_argument("--mid-blocks", type=int, default=8, help="mid: the mid preset's blocks (its own: 8)")
    parser.add_argument("--mid-side", type=int, default=256, help="mid: image side in pixels")
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 4, 5, 9, 10, 11],
                        help="layers: the subgraphs to try")
    args = parser.parse_args()
    torch.set_num_threads(1)
    files = resolve(None)
    pipeline = AnimaPipeline(files, keep_dit=True)
    work = args.work
    onnx = work / "onnx"
    if not (onnx / "manifest.json").exists():
        export_subgraphs(files.dit, IMAGE_SIZE, IMAGE_SIZE, onnx, progress=False, overwrite=True)
    source = read_manifest(onnx)
    calibration_dir = work / "calibration"
    if not (calibration_dir / "calibration.json").exists():
        captions = [s.caption for s in prompt_set(9, seed=11)]
        capture_calibration(load_dit(files.dit, torch.float32), source, calibration_dir,
                            runs(pipeline, captions, 0), steps=STEPS, cfg=CFG, overwrite=True, progress=False)
    calibration = read_calibration(calibration_dir, source)
    report: dict = {}
    for section in args.sections:
        {"algorithms": lambda: algorithms(work, onnx, calibration, report),
         "sigmas": lambda: sigmas(work, onnx, calibration, report),
         "images": lambda: images(work, onnx, calibration, files, pipeline, report, args.images),
         "fullwidth": lambda: full_width(work, report, args.sides, args.budget, args.derive),
         "residency": lambda: residency(work, report, args.sides, args.budget),
         "fullwidth-memory": lambda: fullwidth_memory(work, report, args.sides[-1], args.budget),
         "layers": lambda: layers(work, onnx, calibration, report, args.layers),
         "mid": lambda: mid(work, report, args.mid_blocks, args.mid_side, args.images)}[section]()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
