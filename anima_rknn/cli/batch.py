from __future__ import annotations

import contextlib
import sys

import click
from tqdm import tqdm

from ..batch.jobs_file import BatchJob, prepare_jobs, read_jobs
from ..batch.local import Deliver, LocalRunner
from ..batch.ray_runner import open_ray_runner
from ..batch.results import RESULTS, Outcome, Results, locked_results
from ..batch.worker import Worker
from ..core.threads import AUTO_THREADS, machine_threads
from ..errors import AnimaError
from ..generation.params import RANDOM_SEED, GenerationParams, parse_seeds
from ..generation.pipeline import AnimaPipeline
from ..generation.resume import Interrupted
from ..model.model_set import ModelFiles
from ..sampling.sample import StepEvent
from .group import cli
from .options import (
    lora_dir_option,
    model_options,
    params_from_cli,
    ray_options,
    resolve_model,
    setting_options,
)
from .signals import stop_on_signals


def batch_defaults(files: ModelFiles, settings: dict) -> GenerationParams:
    """The setting options as the jobs' defaults, built as generate builds its settings (the prompts, and
    the LoRAs their tags name, come from the jobs file)."""
    if settings["seed"] == RANDOM_SEED:
        raise AnimaError("a batch needs fixed seeds (a drawn one could not be found again when the batch resumes)")
    return params_from_cli(files, {**settings, "lora_dir": None})


@cli.command("batch")
@click.argument("jobs_file", metavar="JOBS", type=click.Path(dir_okay=False))
@model_options
@setting_options(skip=("prompt",), front="batch")  # the prompts are the jobs'
@lora_dir_option
@click.option("--seeds", default=None,
              help="Seeds for every job that names none, e.g. 1-8 or 1,5,9-12. Default: --seed.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False),
              help="Folder for the PNGs and results.jsonl; a batch run again into it continues where it stopped.")
@click.option("--overwrite", is_flag=True, help="Start over in a folder that holds other files or another batch.")
@click.option("--keep-models/--no-keep-models", default=None,
              help="Keep the DiT loaded between jobs (faster), or load each stage per job (least memory). "
                   "Default: keep, except on the rknn backend (the board's 8 GB).")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None,
              help="Write the running job's resume state every N steps (with --ray: in its worker node's cache "
                   "folder). Default: after every computed step once a job takes over a minute.")
@ray_options
def batch(jobs_file, model, dit, text_encoder, vae, qwen_tokenizer, t5_tokenizer, lora_dir, seeds, out, overwrite,
          keep_models, checkpoint_every, ray_address, ray_resources, ray_workers, **options) -> None:
    """Generate every job of JOBS into --out: a .jsonl file (one job's settings per line: prompt, negative,
    width, height, steps, cfg, seed, shift, cache, cache_options, init_image, mask, ...; the options below are the
    defaults; image paths are relative to JOBS' folder) or a text file of prompts, one per line, each made once per
    --seeds seed."""
    files = resolve_model(model, dit=dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                    t5_tokenizer=t5_tokenizer)
    if options.get("threads") == AUTO_THREADS:  # a job's id hashes its threads: the machine's, not the load's now,
        options["threads"] = machine_threads()  # so that a batch run again later finds its jobs
    defaults = batch_defaults(files, options)
    pipeline = AnimaPipeline(files)
    jobs = read_jobs(jobs_file, defaults, parse_seeds(seeds) if seeds else None, lora_dir,
                     sides_set=[side for side in ("width", "height") if options[side] is not None])
    expected = prepare_jobs(jobs, pipeline, jobs_file)
    keep = defaults.backend != "rknn" if keep_models is None else keep_models
    with contextlib.ExitStack() as stack:
        ray = open_ray_runner(stack, ray_address, ray_resources, ray_workers, files, expected, keep,
                              checkpoint_every, warn=lambda line: tqdm.write(line, file=sys.stderr))
        results = stack.enter_context(locked_results(out, jobs, overwrite=overwrite))  # one batch per --out
        todo = [job for job in jobs if not results.done(job)]
        click.echo(f"{len(jobs)} jobs: {len(jobs) - len(todo)} done before, {len(todo)} to run", err=True)
        failed: list[str] = []

        with tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="batch", unit="job", file=sys.stderr,
                  dynamic_ncols=True) as bar:
            def publish(job: BatchJob, outcome: Outcome) -> None:
                results.add(job, outcome)
                if outcome.error is not None:
                    failed.append(f"line {job.line} (seed {job.params.seed}): {outcome.error}")
                    bar.write(f"job failed: {failed[-1]}", file=sys.stderr)
                bar.set_postfix_str(outcome.worker)
                bar.update(1)

            if ray is None:
                def warn(e: AnimaError) -> None:
                    bar.write(f"warning: checkpoint not written (the job goes on): {e}", file=sys.stderr)

                run_local(todo, results, Worker(files, keep, checkpoint_every=checkpoint_every, warn=warn), bar,
                          publish)
            else:
                ray.run(todo, publish)
    click.echo(f"{len(todo) - len(failed)} images written to {results.folder} ({RESULTS} has every job's record)",
               err=True)
    if failed:
        raise AnimaError(f"{len(failed)} of {len(todo)} jobs failed (first: {failed[0]}); their records say why, "
                         "and running the same command again retries them")


def run_local(jobs: list[BatchJob], results: Results, worker: Worker, bar: tqdm, publish: Deliver) -> None:
    """In this process; Ctrl-C / SIGTERM stops the running job after its step and keeps its resume state."""
    def on_step(event: StepEvent) -> None:
        bar.set_postfix_str(f"step {event.step}/{event.total}")

    try:
        with stop_on_signals() as stops:
            LocalRunner(worker, results.folder, stop=lambda: bool(stops), on_step=on_step).run(jobs, publish)
    except Interrupted as e:
        bar.close()
        where = "before its first step" if e.path is None else f"after step {e.step}/{e.total}, its state kept"
        click.echo(f"stopped {where}; run the same command again to continue", err=True)
        sys.exit(128 + stops[0])
