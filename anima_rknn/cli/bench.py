from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import click
from tqdm import tqdm

from ..batch.jobs_file import BatchJob, one_sweep, prepare_jobs, read_jobs
from ..batch.local import LocalRunner
from ..batch.ray_runner import open_ray_runner
from ..batch.results import Outcome
from ..batch.worker import Worker
from ..bench import DEFAULT_MIN_PSNR
from ..bench.run import MAX_REPEATS, MAX_SEEDS
from ..core.files import output_folder
from ..errors import AnimaError
from ..generation.params import parse_seeds
from ..generation.pipeline import AnimaPipeline
from ..generation.result import GenerationResult, publish
from ..sampling.sample import StepEvent
from .group import cli
from .options import (
    FINITE,
    lora_dir_option,
    model_options,
    params_from_cli,
    ray_options,
    resolve_model,
    setting_options,
)

if TYPE_CHECKING:
    from ..bench.run import BenchResult

VERDICT_FAILED_EXIT = 3  # 1 is a user error, 2 a usage error


def bench_modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    """(run, report, figures): they need the optional `bench` extra, so every other command works without it."""
    try:
        from ..bench import figures, report, run
    except ModuleNotFoundError as e:
        raise AnimaError(f"bench needs {e.name}: pip install 'anima-rknn[bench]'") from None
    return run, report, figures


def save_images(result: BenchResult, report: dict, out: Path, model_name: str) -> None:
    """Every decoded image with the `parameters` chunk generate writes, so each can be reproduced alone, under the
    name the report gives it."""
    for seed_result, entry in zip(result.seeds, report["seeds"]):
        sides = [(seed_result.baseline, entry["baseline"]),
                 *((policy, entry["cached"][name]) for name, policy in seed_result.cached.items())]
        for policy, side in sides:
            run = policy.first
            if side["image"] is not None:  # a run that is not finite has no image (the report says so)
                generation = GenerationResult(run.image, run.denoised.sample.latent, policy.params,
                                              result.conditioning, run.denoised, run.decode_s, result.decode.backend,
                                              model_name, first_pass=run.first_pass, vae_encode_s=run.vae_encode_s)
                publish(generation, out / side["image"], overwrite=True)


@cli.command("bench")
@model_options
@setting_options(skip=("cache", "sampler"))
@lora_dir_option
@click.option("--cache", "caches", default="spectrum", show_default=True,
              help="Cache policy, or a comma list (spectrum,spectrum-plus,reuse) each run against one shared "
                   "baseline; none gives a second uncached run.")
@click.option("--sampler", "samplers", default=None,
              help="Sampler (as generate's --sampler: A1111's display names too), or a comma list "
                   "(euler,dpmpp_2m_sde,er_sde) each with its own baseline and cached runs, compared in a row per "
                   "sampler; --eta / --s-noise then apply to every one, so list only samplers that have them. "
                   "Default: euler (with --jobs: the jobs' own).")
@click.option("--seeds", default=None, help=f"Seeds, e.g. 1-8 or 1,5,9-12 (one table per seed plus aggregates; "
                                            f"at most {MAX_SEEDS}); overrides --seed.")
@click.option("--jobs", "jobs_file", type=click.Path(dir_okay=False), default=None,
              help="Take the prompt and seeds from a `batch` jobs file instead (one prompt's seeds: its jobs may "
                   "differ only in their seed).")
@click.option("--repeat", type=click.IntRange(1, MAX_REPEATS), default=1, show_default=True,
              help="Runs per side and seed; times are reported as min and median.")
@click.option("--min-psnr", type=FINITE, default=DEFAULT_MIN_PSNR, show_default=True,
              help="Verdict threshold: lowest acceptable PSNR (dB) of a cached image against the baseline.")
@click.option("--min-ssim", type=FINITE, default=None, help="Verdict threshold on SSIM too (not checked by default).")
@click.option("--fail-on-verdict", is_flag=True,
              help=f"Exit with code {VERDICT_FAILED_EXIT} when the verdict fails (for scripts).")
@ray_options
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Folder for report.json, report.md, the images and plots.")
@click.option("--overwrite", is_flag=True, help="Write into a non-empty --out folder.")
@click.option("--json", "as_json", is_flag=True, help="Print report.json on stdout too.")
def bench(model, dit, text_encoder, vae, qwen_tokenizer, t5_tokenizer, caches, samplers, seeds, jobs_file, repeat,
          min_psnr, min_ssim, fail_on_verdict, ray_address, ray_resources, ray_workers, out, overwrite, as_json,
          **settings) -> None:
    """Cached vs uncached baseline with the same weights, seed and noise: speed, work and image fidelity."""
    run_module, report_module, figures = bench_modules()
    cache_names = run_module.parse_cache_list(caches)
    sampler_names = [] if samplers is None else run_module.parse_sampler_list(samplers)
    if sampler_names:
        settings["sampler"] = sampler_names[0]  # every job's own; the sweep runs the others beside it
    if jobs_file is not None and (settings["prompt"] is not None or seeds is not None):
        raise AnimaError("--jobs gives the prompt and the seeds: drop --prompt and --seeds")
    if settings["prompt"] is None and jobs_file is None:
        raise AnimaError("pass --prompt (or --jobs JOBS)")
    files = resolve_model(model, dit=dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                    t5_tokenizer=t5_tokenizer)
    params = params_from_cli(files, settings)
    # The cache options are the cached sides'; every job's own settings are the baseline's (cache none).
    cache_options, params = params.cache_options, dataclasses.replace(params, cache_options={})
    seed_list = [params.seed] if seeds is None else parse_seeds(seeds, MAX_SEEDS)  # params drew a seed of -1
    params = dataclasses.replace(params, seed=seed_list[0])
    if jobs_file is not None:
        jobs = read_jobs(jobs_file, params, lora_dir=settings["lora_dir"],
                         sides_set=[side for side in ("width", "height") if settings[side] is not None])
        params, seed_list = one_sweep(jobs, MAX_SEEDS)
    else:
        jobs = [BatchJob(0, dataclasses.replace(params, seed=one_seed)) for one_seed in seed_list]
    # One sampler is the jobs' own setting; several (or one given with --jobs, over the jobs') are the sweep's.
    listed = tuple(sampler_names) if len(sampler_names) > 1 or jobs_file is not None else ()
    sweep = run_module.Sweep(tuple(cache_names), cache_options, repeat, listed)
    sweep.check(params)  # bad options, or an eta a listed sampler lacks, fail before the folder is made
    expected = prepare_jobs(jobs, AnimaPipeline(files), jobs_file)
    out_dir = Path(out)
    output_folder(out_dir, overwrite=overwrite, names=["report.json", "report.md"],
                  holds="a bench report" if (out_dir / "report.json").exists() else "other files")

    # A run's steps: every pass's, an img2img pass's truncated schedule (the step events count them so).
    sides, steps = len(sweep.samplers or (params.sampler,)) * (1 + len(cache_names)), params.steps_run()
    with contextlib.ExitStack() as stack, tqdm(total=len(jobs) * repeat * sides * steps, desc="bench", unit="step",
                                               file=sys.stderr, dynamic_ncols=True) as bar:
        ray = open_ray_runner(stack, ray_address, ray_resources, ray_workers, files, expected, keep_models=True,
                              warn=lambda line: tqdm.write(line, file=sys.stderr))
        parts: dict[str, BenchResult] = {}

        def publish(job: BatchJob, outcome: Outcome) -> None:
            if outcome.result is None:
                raise AnimaError(f"seed {job.params.seed}: {outcome.error}")
            for seed_result in outcome.result.seeds:  # one per sampler of the sweep
                seed_result.worker = outcome.worker
            parts[job.id] = outcome.result
            if ray is not None:  # a worker's steps are not seen here: the bar moves a seed at a time
                bar.set_postfix_str(f"seed {job.params.seed} from {outcome.worker}")
                bar.update(repeat * sides * steps)

        if ray is None:
            runs_begun = 0

            def on_run(run_seed: int, side: str, index: int) -> None:
                nonlocal runs_begun
                runs_begun += 1
                bar.set_description(f"seed {run_seed} {side} {index + 1}/{repeat}")

            def on_step(event: StepEvent) -> None:
                bar.set_postfix_str("model" if event.computed else "forecast")
                # the run's step number, not a count of events: verify's re-run goes back over steps already done
                bar.update((runs_begun - 1) * steps + event.step - bar.n)

            LocalRunner(Worker(files, keep_models=True), out_dir, on_step=on_step).run_tasks(
                jobs, run_module.SweepTask(sweep, on_run), publish)
        else:
            ray.run(jobs, publish, run_module.SweepTask(sweep))
    result = run_module.merge([parts[job.id] for job in jobs])

    report = report_module.build_report(result, files.dit.name, report_module.Thresholds(min_psnr, min_ssim))
    save_images(result, report, out_dir, files.dit.name)
    figures.write_figures(result, report, out_dir)
    report_module.write_report(report, out_dir)
    if as_json:
        click.echo(report_module.to_json(report))
    echo = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    for name, agg in report["aggregate"].items():
        echo(f"{name}: denoise {agg['denoise_speedup_median']:.2f}x (ideal {agg['ideal_speedup_median']:.2f}x), "
             f"end to end {agg['end_to_end_speedup_median']:.2f}x"
             + ("" if agg["psnr_db"] is None else f", PSNR min {agg['psnr_db']['min']:.2f} dB")
             + f", passes mean {agg['transformer_passes']['mean']:.1f} max {agg['transformer_passes']['max']}"
             + ("" if agg["estimate_psnr_spearman"] is None
                else f", error estimate vs PSNR Spearman {agg['estimate_psnr_spearman']:.2f}")
             + ("" if agg["flag"] is None else f", flagged 'may differ' {agg['flag']['flagged']}/{agg['seeds']} "
                f"({agg['flag']['flagged_below_30db']} of the {agg['flag']['below_30db']} under 30 dB)"))
    echo(f"wrote {out_dir / 'report.md'} and report.json, images and plots")
    echo(report["verdict"]["line"])
    if fail_on_verdict and not report["verdict"]["passed"]:
        sys.exit(VERDICT_FAILED_EXIT)
