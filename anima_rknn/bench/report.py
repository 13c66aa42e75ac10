"""The bench's findings as report.json (every number) and report.md (the on-device report's table layout:
baseline | cached | difference and speedup), with the verdict on whether caching is safe for the setting.

A bench of several samplers has a seed entry per seed and sampler (each against that sampler's own baseline), its
policies named "SAMPLER/CACHE" in the aggregate and the verdict, its files prefixed with the sampler, and a row per
sampler in "samplers"; a bench of one sampler reads as it always did.

Image to image: the settings name the init image, the strength and the steps each pass ran; a side's numbers are
the whole run's (every pass's time and work; computed / skipped model calls numbered through the passes, the hires
pass's after the first's), with each pass's own under "passes". The x0 distance compares each step's x0 with the
baseline's same step, so with the hires fix its last steps are the hires pass's, at the hires size; the final
latent error and the images are the final pass's."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.files import json_text, write_text
from ..generation.result import call_noun, dtype_ran, image_to_image_record, stage_text
from ..sampling.samplers import SAMPLERS
from . import DEFAULT_MIN_PSNR, metrics
from .run import BASELINE, BenchResult, PolicyRuns, SeedResult

MB = 1024 * 1024


@dataclass
class Thresholds:
    min_psnr: float = DEFAULT_MIN_PSNR
    min_ssim: float | None = None  # None: not checked


# `prefix`: "" in a bench of one sampler, "SAMPLER_" in one of several (sampler_prefix).
def image_file(side: str, seed: int, prefix: str = "") -> str:
    return f"{prefix}{side}_seed{seed}.png"


def comparison_file(cache: str, seed: int, prefix: str = "") -> str:
    return f"compare_{prefix}{cache}_seed{seed}.png"


def steps_plot_file(seed: int, prefix: str = "") -> str:
    return f"steps_{prefix}seed{seed}.png"


def samplers_of(result: BenchResult) -> list[str]:
    """The samplers a bench ran, in the order asked for."""
    return list(dict.fromkeys(seed_result.sampler for seed_result in result.seeds))


def sampler_prefix(sampler: str, several: bool) -> str:
    return f"{sampler}_" if several else ""


def policy_name(sampler: str, cache: str, several: bool) -> str:
    """How the aggregate and the verdict name a cached policy: its cache, with its sampler in a bench of several."""
    return f"{sampler}/{cache}" if several else cache


def _stats(values: Sequence[float]) -> dict[str, Any]:
    return {"min": min(values), "median": statistics.median(values), "all": list(values)}


def _passes(policy: PolicyRuns) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """Each pass of the policy's first run (its size, schedule, steps run, model calls, work and time), and its
    computed / skipped / recomputed model calls numbered through the passes (the second's after the first's)."""
    params, run = policy.params, policy.first
    entries, numbered, offset = [], {"computed_steps": [], "skipped_steps": [], "recomputed_steps": []}, 0
    for denoise_pass, denoised in zip(params.passes(), run.denoised_passes):
        calls, sample = params.model_calls(denoise_pass.sigmas), denoised.sample
        entries.append({"width": denoise_pass.width, "height": denoise_pass.height, "steps": denoise_pass.steps,
                        "start": denoise_pass.start, "steps_run": denoise_pass.steps_run,
                        "cache": denoise_pass.cache, "model_calls": calls,
                        "computed": len(sample.computed_steps), "transformer_passes": denoised.transformer_passes,
                        "denoise_s": denoised.denoise_s})
        for key in numbered:
            numbered[key] += [offset + call for call in getattr(sample, key)]
        offset += calls
    return entries, numbered


def _side(policy: PolicyRuns, label: str, prefix: str) -> dict[str, Any]:
    first = policy.first
    sample = first.denoised.sample
    peaks = [run.peak_rss_bytes for run in policy.runs if run.peak_rss_bytes is not None]
    per_step = zip(*(run.step_times for run in policy.runs))
    passes, numbered = _passes(policy)
    return {
        "cache": policy.params.cache,
        "cache_options": policy.params.cache_options,
        "image": image_file(label, policy.params.seed, prefix) if first.image is not None else None,
        "timings_s": {
            # The init image's (a Lanczos hires fix's: its upscaled picture's); 0 without one.
            "vae_encode": _stats([run.vae_encode_s for run in policy.runs]),
            "denoise": _stats([run.denoise_s for run in policy.runs]),
            "decode": _stats([run.decode_s for run in policy.runs]),
            "total_excl_encode": _stats([run.total_s for run in policy.runs]),
        },
        "step_times_s": [statistics.median(times) for times in per_step],  # median over repeats
        # computed / skipped / recomputed number model calls (= steps for samplers that call the model once a
        # step) over every pass; forecast_steps are the steps where a forecast stood in for one call at least.
        "model_calls": sum(p["model_calls"] for p in passes),
        "steps_run": sum(p["steps_run"] for p in passes),
        **numbered,
        "forecast_steps": first.forecast_steps,
        "error_estimate": sample.error_estimate,  # the cache's own, made without the baseline (None: no estimate)
        "may_differ": sample.may_differ,  # the cache's own flag (None: the cache does not check itself)
        "rerun_from": sample.rerun_from,  # verify re-ran the steps after this one uncached (None: not re-run)
        "transformer_passes": sum(d.transformer_passes for d in first.denoised_passes),
        "subgraph_runs": sum(d.subgraph_runs for d in first.denoised_passes),
        "partial_passes": sum(d.partial_passes for d in first.denoised_passes),  # auto's check, in subgraph_runs
        # where the picture's pass's time went, per stage (board_times: false off the board: not its times)
        "stages": first.denoised.stage_times,
        "finite": sample.finite,
        "peak_rss_mb": max(peaks) / MB if peaks else None,  # the highest over repeats
        "passes": passes,
    }


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.inf


def _comparison(baseline: PolicyRuns, cached: PolicyRuns, side: dict[str, Any],
                base: dict[str, Any]) -> dict[str, Any]:
    speedup = {name: {stat: _ratio(base["timings_s"][key][stat], side["timings_s"][key][stat])
                      for stat in ("min", "median")}
               for name, key in (("denoise", "denoise"), ("end_to_end", "total_excl_encode"))}
    # full passes, not computed steps: verify's re-run computes steps the first run had forecast, at their cost
    ideal = _ratio(base["transformer_passes"], side["transformer_passes"])
    result: dict[str, Any] = {
        "speedup": speedup,
        "ideal_speedup": ideal,  # the baseline's transformer passes / the side's
        "measured_over_ideal": speedup["denoise"]["median"] / ideal,
        "psnr_db": None, "ssim": None, "latent_error": None, "x0_distance": None,
    }
    b, c = baseline.first, cached.first
    if b.image is not None and c.image is not None:
        result["psnr_db"], result["ssim"] = metrics.psnr(b.image, c.image), metrics.ssim(b.image, c.image)
    if b.denoised.sample.finite and c.denoised.sample.finite:
        error = metrics.latent_error(b.denoised.sample.latent, c.denoised.sample.latent)
        result["latent_error"] = {"relative_l2": error.relative_l2, "max_abs": error.max_abs, "rmse": error.rmse}
        result["x0_distance"] = metrics.x0_distances(b.x0_history, c.x0_history)
    return result


def _failures(base: dict[str, Any], side: dict[str, Any], comparison: dict[str, Any],
              thresholds: Thresholds) -> list[str]:
    if not base["finite"]:
        return ["the baseline latent is not finite, nothing to compare with"]
    if not side["finite"]:
        return ["the cached latent is not finite"]
    failures = []
    if comparison["psnr_db"] < thresholds.min_psnr:
        failures.append(f"PSNR {comparison['psnr_db']:.2f} dB < {thresholds.min_psnr:g} dB")
    if thresholds.min_ssim is not None and comparison["ssim"] < thresholds.min_ssim:
        failures.append(f"SSIM {comparison['ssim']:.4f} < {thresholds.min_ssim:g}")
    return failures


def _seed_entry(seed_result: SeedResult, thresholds: Thresholds, several: bool) -> dict[str, Any]:
    prefix = sampler_prefix(seed_result.sampler, several)
    base = _side(seed_result.baseline, BASELINE, prefix)
    cached = {}
    for name, policy in seed_result.cached.items():
        side = _side(policy, name, prefix)
        side["vs_baseline"] = _comparison(seed_result.baseline, policy, side, base)
        side["failures"] = _failures(base, side, side["vs_baseline"], thresholds)
        cached[name] = side
    seed = seed_result.seed
    return {"seed": seed, "sampler": seed_result.sampler, "worker": seed_result.worker, "baseline": base,
            "cached": cached, "steps_plot": steps_plot_file(seed, prefix),
            "comparisons": {name: comparison_file(name, seed, prefix)
                            for name, side in cached.items() if side["vs_baseline"]["psnr_db"] is not None}}


def _policies(seeds: list[dict[str, Any]], samplers: list[str], caches: list[str]) -> dict[str, tuple[str, list]]:
    """Each cached policy's name (policy_name) -> (its cache, the seed entries of its sampler)."""
    several = len(samplers) > 1
    return {policy_name(sampler, cache, several): (cache, [entry for entry in seeds if entry["sampler"] == sampler])
            for sampler in samplers for cache in caches}


def _sampler_row(sampler: str, entries: list[dict[str, Any]], policies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One sampler of the bench: its model calls, its baseline's time and work, and how each cache fared on it."""
    bases = [entry["baseline"] for entry in entries]
    return {"label": SAMPLERS[sampler].label, "model_calls": bases[0]["model_calls"],
            "baseline_denoise_s_median": statistics.median(b["timings_s"]["denoise"]["median"] for b in bases),
            "baseline_transformer_passes": bases[0]["transformer_passes"], "policies": policies}


def _aggregate(seeds: list[dict[str, Any]], cache: str) -> dict[str, Any]:
    sides = [entry["cached"][cache] for entry in seeds]
    comparisons = [side["vs_baseline"] for side in sides]

    def spread(key: str) -> dict[str, float] | None:
        values = [c[key] for c in comparisons if c[key] is not None]
        return {"min": min(values), "mean": statistics.fmean(values)} if values else None

    passes = [side["transformer_passes"] for side in sides]  # an adaptive cache's can differ per seed
    estimates = [side["error_estimate"] for side in sides]
    psnrs = [c["psnr_db"] for c in comparisons]
    ranked = None not in estimates and None not in psnrs and len(sides) >= 3
    return {
        "seeds_passed": sum(not side["failures"] for side in sides), "seeds": len(sides),
        "psnr_db": spread("psnr_db"), "ssim": spread("ssim"),
        "transformer_passes": {"mean": statistics.fmean(passes), "max": max(passes)},
        # Does the cache's own error estimate rank the seeds as the true PSNR does? (1: perfectly, by -estimate)
        "estimate_psnr_spearman": metrics.spearman([-e for e in estimates], psnrs) if ranked else None,
        # The flag "may differ visibly" against the seeds under 30 dB (None: the cache does not check itself).
        "flag": None if None in [side["may_differ"] for side in sides] else {
            "flagged": sum(side["may_differ"] for side in sides),
            "below_30db": sum(p is not None and p < 30 for p in psnrs),
            "flagged_below_30db": sum(bool(side["may_differ"]) and p is not None and p < 30
                                      for side, p in zip(sides, psnrs))},
        "denoise_speedup_median": statistics.median(c["speedup"]["denoise"]["median"] for c in comparisons),
        "end_to_end_speedup_median": statistics.median(c["speedup"]["end_to_end"]["median"] for c in comparisons),
        "ideal_speedup_median": statistics.median(c["ideal_speedup"] for c in comparisons),
    }


def _verdict(policies_seeds: dict[str, tuple[str, list]], thresholds: Thresholds) -> dict[str, Any]:
    policies, parts = {}, []
    for name, (cache, seeds) in policies_seeds.items():
        failures = [f"seed {entry['seed']}: {failure}"
                    for entry in seeds for failure in entry["cached"][cache]["failures"]]
        policies[name] = {"passed": not failures, "failures": failures}
        if failures:
            parts.append(f"{name} is not safe here ({'; '.join(failures)})")
        else:
            worst = min(entry["cached"][cache]["vs_baseline"]["psnr_db"] for entry in seeds)
            parts.append(f"{name} is safe here (worst PSNR {_db(worst)} >= {thresholds.min_psnr:g} dB"
                         f"{'' if thresholds.min_ssim is None else f', SSIM >= {thresholds.min_ssim:g}'}, "
                         f"all finite, {len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
    passed = all(p["passed"] for p in policies.values())
    return {"passed": passed, "policies": policies, "line": f"{'PASS' if passed else 'FAIL'}: " + "; ".join(parts)}


def build_report(result: BenchResult, model_name: str, thresholds: Thresholds | None = None) -> dict[str, Any]:
    """Every number of the bench as plain data; strict JSON through to_json()."""
    thresholds = thresholds or Thresholds()
    params = result.seeds[0].baseline.params
    image_size = result.seeds[0].baseline.first.image.size if result.seeds[0].baseline.first.image else None
    caches = list(result.seeds[0].cached)
    samplers = samplers_of(result)
    several = len(samplers) > 1
    seeds = [_seed_entry(seed_result, thresholds, several) for seed_result in result.seeds]
    policies = _policies(seeds, samplers, caches)
    aggregate = {name: _aggregate(entries, cache) for name, (cache, entries) in policies.items()}
    return {
        "settings": {
            "model": model_name, "prompt": params.prompt, "negative": params.negative,
            "width": params.width, "height": params.height, "steps": params.steps, "cfg": params.cfg,
            "shift": params.shift, "scheduler": params.scheduler, "sampler": params.sampler, "samplers": samplers,
            "eta": params.eta, "s_noise": params.s_noise, "dtype": dtype_ran(params),
            "threads": params.threads, "backend": params.backend, "vae_tile": result.decode.tile,
            "vae_backend": result.decode.backend,
            "steps_run": params.steps_run(), "image_size": list(image_size) if image_size else None,
            "passes": [{"width": p.width, "height": p.height, "steps": p.steps, "start": p.start,
                        "steps_run": p.steps_run} for p in params.passes()],
            **image_to_image_record(params),
            "seeds": list(dict.fromkeys(entry["seed"] for entry in seeds)), "repeats": result.repeats,
            "caches": {name: seeds[0]["cached"][name]["cache_options"] for name in caches},
        },
        "encode": {"encode_s": result.conditioning.encode_s,
                   "peak_rss_mb": None if result.encode_peak_rss_bytes is None else result.encode_peak_rss_bytes / MB},
        "thresholds": {"min_psnr": thresholds.min_psnr, "min_ssim": thresholds.min_ssim},
        "seeds": seeds,
        "samplers": {sampler: _sampler_row(sampler, [entry for entry in seeds if entry["sampler"] == sampler],
                                           {cache: aggregate[policy_name(sampler, cache, several)] for cache in caches})
                     for sampler in samplers},
        "aggregate": aggregate,
        "verdict": _verdict(policies, thresholds),
    }


def _run_text(s: dict[str, Any]) -> str:
    """What each run made, as generate's line says it: "64x64, 12 of 20 steps (strength 0.6), img2img of x.png";
    with the hires fix "32x32 -> 64x64 (hires fix), 20 steps + 15 of 20 hires steps (strength 0.75)"."""
    passes = s["passes"]
    size = " -> ".join(f"{p['width']}x{p['height']}" for p in passes) + (" (hires fix)" if len(passes) > 1 else "")
    if s["image_size"] and s["image_size"] != [passes[-1]["width"], passes[-1]["height"]]:
        size += f", pasted into {s['image_size'][0]}x{s['image_size'][1]}"
    strength = s.get("strength", s.get("hires", {}).get("strength"))
    steps = " + ".join((f"{p['steps']}" if p["start"] == 0 else f"{p['steps_run']} of {p['steps']}")
                       + (" hires steps" if index else " steps")
                       + ("" if p["start"] == 0 else f" (strength {strength:g})") for index, p in enumerate(passes))
    text = f"{size}, {steps}"
    if "init_image" in s:
        kind = ("outpainting" if s.get("outpaint") else "inpainting" if s.get("mask") else "img2img")
        text += f", {kind} of {s['init_image']['name']} (sha256 {s['init_image']['sha256'][:12]})"
    return text


def to_json(report: dict[str, Any]) -> str:
    return json_text(report, indent=2)


def _db(value: float) -> str:
    return "inf dB (identical)" if math.isinf(value) else f"{value:.2f} dB"


def _seconds(stats: dict[str, Any], repeats: int) -> str:
    return f"{stats['median']:.2f} s" if repeats == 1 else f"{stats['median']:.2f} s (min {stats['min']:.2f})"


def _speed(speedup: dict[str, float], repeats: int) -> str:
    return f"{speedup['median']:.2f}x" + ("" if repeats == 1 else f" (min/min {speedup['min']:.2f}x)")


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} MB"


def _largest_step(distances: list[float] | None) -> str:
    if not distances:
        return "n/a"
    largest = max(distances)
    return f"{largest:.4f} (step {1 + distances.index(largest)})"


def _seed_table(entry: dict[str, Any], steps: int, repeats: int) -> list[str]:
    """`steps`: the steps a run makes (over every pass, each img2img pass's truncated schedule)."""
    base, cached = entry["baseline"], entry["cached"]
    calls = base["model_calls"]  # the steps, or more for a sampler that calls the model twice a step
    header = "| | baseline | " + " | ".join(f"{name} | {name} vs baseline" for name in cached) + " |"
    lines = [header, "|---|---|" + "---|---|" * len(cached)]

    def row(title: str, base_cell: str, cells: list[tuple[str, str]]) -> None:
        lines.append(f"| {title} | {base_cell} | " + " | ".join(f"{a} | {b}" for a, b in cells) + " |")

    def diff(key: str) -> list[tuple[str, str]]:
        return [(str(side[key]), f"{side[key] - base[key]:+d}") for side in cached.values()]

    comparisons = [side["vs_baseline"] for side in cached.values()]
    row(f"computed {call_noun(calls, steps)}", f"{len(base['computed_steps'])}/{calls}",
        [(f"{len(side['computed_steps'])}/{calls}", f"ideal {c['ideal_speedup']:.2f}x")
         for side, c in zip(cached.values(), comparisons)])
    row("transformer passes", str(base["transformer_passes"]), diff("transformer_passes"))
    row("subgraph runs", str(base["subgraph_runs"]), diff("subgraph_runs"))
    if any(side["partial_passes"] for side in cached.values()):
        row("partial passes (auto's check)", "0", diff("partial_passes"))
    timings = base["timings_s"]
    row("denoise", _seconds(timings["denoise"], repeats),
        [(_seconds(side["timings_s"]["denoise"], repeats),
          f"{_speed(c['speedup']['denoise'], repeats)}, {c['measured_over_ideal']:.0%} of ideal")
         for side, c in zip(cached.values(), comparisons)])
    if timings["vae_encode"]["median"] > 0:
        row("VAE encode", _seconds(timings["vae_encode"], repeats),
            [(_seconds(side["timings_s"]["vae_encode"], repeats), "") for side in cached.values()])
    row("decode", _seconds(timings["decode"], repeats),
        [(_seconds(side["timings_s"]["decode"], repeats), "") for side in cached.values()])
    row("total excl. encoding", _seconds(timings["total_excl_encode"], repeats),
        [(_seconds(side["timings_s"]["total_excl_encode"], repeats), _speed(c["speedup"]["end_to_end"], repeats))
         for side, c in zip(cached.values(), comparisons)])
    row("peak RSS", _mb(base["peak_rss_mb"]),
        [(_mb(side["peak_rss_mb"]), "n/a" if None in (side["peak_rss_mb"], base["peak_rss_mb"])
          else f"{side['peak_rss_mb'] - base['peak_rss_mb']:+.0f} MB") for side in cached.values()])
    row("finite", "yes" if base["finite"] else "NO",
        [("yes" if side["finite"] else "NO",
          f"recomputed {side['recomputed_steps']}" if side["recomputed_steps"] else "") for side in cached.values()])
    row("PSNR / SSIM", "", [("", "n/a" if c["psnr_db"] is None else f"{_db(c['psnr_db'])} / {c['ssim']:.4f}")
                            for c in comparisons])
    row("cache error estimate", "", [("", "" if side["error_estimate"] is None else f"{side['error_estimate']:.4f}")
                                     for side in cached.values()])
    row("cache may differ", "", [("", "" if side["may_differ"] is None else "yes" if side["may_differ"] else "no")
                                 for side in cached.values()])
    row("final latent error", "", [("", "n/a" if c["latent_error"] is None else
                                    f"rel. L2 {c['latent_error']['relative_l2']:.4f}, "
                                    f"max abs {c['latent_error']['max_abs']:.4f}") for c in comparisons])
    row("max x0 distance", "", [("", _largest_step(c["x0_distance"])) for c in comparisons])
    return lines


def _aggregate_table(aggregate: dict[str, Any]) -> list[str]:
    lines = [("| policy | seeds passed | PSNR min / mean | SSIM min / mean | passes mean / max | denoise speedup | "
              "end-to-end speedup | ideal | error estimate vs PSNR (Spearman) |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for cache, agg in aggregate.items():
        psnr = "n/a" if agg["psnr_db"] is None else f"{_db(agg['psnr_db']['min'])} / {_db(agg['psnr_db']['mean'])}"
        ssim = "n/a" if agg["ssim"] is None else f"{agg['ssim']['min']:.4f} / {agg['ssim']['mean']:.4f}"
        rho = agg["estimate_psnr_spearman"]
        lines.append(f"| {cache} | {agg['seeds_passed']}/{agg['seeds']} | {psnr} | {ssim} | "
                     f"{agg['transformer_passes']['mean']:.1f} / {agg['transformer_passes']['max']} | "
                     f"{agg['denoise_speedup_median']:.2f}x | {agg['end_to_end_speedup_median']:.2f}x | "
                     f"{agg['ideal_speedup_median']:.2f}x | {'n/a' if rho is None else f'{rho:.2f}'} |")
    return lines


def _samplers_table(report: dict[str, Any]) -> list[str]:
    caches = list(report["settings"]["caches"])
    lines = ["| sampler | model calls | baseline denoise | baseline passes | "
             + " | ".join(f"{cache}: denoise speedup, PSNR min" for cache in caches) + " |",
             "|---|---|---|---|" + "---|" * len(caches)]
    for sampler, row in report["samplers"].items():
        cells = [f"{agg['denoise_speedup_median']:.2f}x, "
                 + ("n/a" if agg["psnr_db"] is None else _db(agg["psnr_db"]["min"]))
                 for agg in row["policies"].values()]
        lines.append(f"| {sampler} ({row['label']}) | {row['model_calls']} | "
                     f"{row['baseline_denoise_s_median']:.2f} s | "
                     f"{row['baseline_transformer_passes']} | " + " | ".join(cells) + " |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    repeats = s["repeats"]
    several = len(s["samplers"]) > 1
    sampler = f"samplers {', '.join(s['samplers'])}" if several else f"sampler {s['sampler']}"
    lines = ["# anima-rknn bench: cached vs baseline", "",
             (f"Prompt: {s['prompt']!r}; {_run_text(s)}, {sampler}, "
              f"schedule {s['scheduler']}, CFG {s['cfg']:g}, "
              f"shift {s['shift']:g}, {s['dtype']}, {s['backend']} backend on {s['threads']} threads, "
              f"model {s['model']}, "
              f"VAE {'tiled ' + str(s['vae_tile']) + ' px' if s['vae_tile'] else 'untiled'} on {s['vae_backend']}."),
             f"Prompt encoding (shared by all runs, done once): {report['encode']['encode_s']:.2f} s, "
             f"peak RSS {_mb(report['encode']['peak_rss_mb'])}. Total excl. encoding = "
             + ("VAE encode + " if "init_image" in s or s.get("hires", {}).get("upscaler") == "lanczos" else "")
             + "denoise + decode."
             + ("" if repeats == 1 else f" Times: median of {repeats} repeats (min in brackets); "
                "speedups: median/median (min/min)."),
             ]
    if several:
        lines += ["", "## Samplers (each against its own uncached baseline; speedups: median over seeds)", ""] \
            + _samplers_table(report)
    for entry in report["seeds"]:
        made_by = f" (worker {entry['worker']})" if entry["worker"] else ""
        title = f"Seed {entry['seed']}, {entry['sampler']}" if several else f"Seed {entry['seed']}"
        lines += ["", f"## {title}{made_by}", ""] + _seed_table(entry, s["steps_run"], repeats)
        sides = {"baseline": entry["baseline"], **entry["cached"]}
        lines += [""] + [f"- {name}: {stage_text(side['stages'])}" for name, side in sides.items()
                         if side["stages"] is not None]
    if len(s["seeds"]) > 1:
        lines += ["", "## All seeds (speedups: median over seeds)", ""] + _aggregate_table(report["aggregate"])
    lines += ["", f"**Verdict: {report['verdict']['line']}**", ""]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> None:
    for name, text in (("report.json", to_json(report) + "\n"), ("report.md", markdown(report))):
        write_text(out_dir / name, text, overwrite=True)
