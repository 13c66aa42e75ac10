from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from typing import TYPE_CHECKING

import click
from tqdm import tqdm

from ..batch.jobs import BatchJob, name_jobs, parse_seeds, read_jobs
from ..batch.local import LocalRunner, Publish
from ..batch.results import RESULTS, Outcome, Results
from ..batch.worker import Expected, Worker
from ..errors import AnimaError
from ..generation.pipeline import RANDOM_SEED, AnimaPipeline, GenerationParams
from ..generation.resume import Interrupted
from ..model.model_set import ModelFiles, resolve
from ..sampling.euler import StepEvent

if TYPE_CHECKING:
    from ..batch.ray_runner import RayRunner
from . import cli
from .generate import stop_on_signals
from .options import generation_options, generation_params, ray_options


def batch_defaults(files: ModelFiles, **settings) -> GenerationParams:
    """The generation options as the jobs' defaults, built as generate builds its settings (the prompts, and
    the LoRAs their tags name, come from the jobs file)."""
    if settings["prompt"] is not None:
        raise AnimaError("the prompts come from JOBS; --prompt is not taken here")
    if settings["seed"] == RANDOM_SEED:
        raise AnimaError("a batch needs fixed seeds (a drawn one could not be found again when the batch resumes)")
    return generation_params(files, **{**settings, "prompt": "", "lora_dir": None})


def check_jobs(jobs: list[BatchJob], pipeline: AnimaPipeline, source: str | None = None) -> Expected:
    """Prepare each job as generate prepares its run (before anything runs; `source`: the jobs file, named with
    the line in errors) and name it; returns the model fingerprints the workers must have, one entry per set of
    model files (subgraph sets, LoRAs) in the jobs."""
    for job in jobs:
        try:
            pipeline.prepare(job.params)
        except AnimaError as e:
            raise AnimaError(f"{source} line {job.line}: {e}" if source else str(e)) from None
    prints: dict[str, tuple[GenerationParams, dict[str, str | None]]] = {}

    def fingerprints(params: GenerationParams) -> dict[str, str | None]:
        key = repr(dataclasses.replace(params, prompt="", negative="", seed=0))  # all a sweep's jobs share
        if key not in prints:
            prints[key] = (params, pipeline.fingerprints(params))
        return prints[key][1]

    name_jobs(jobs, fingerprints)
    # Kinds of run with the same model files need one check on a worker.
    return list({json.dumps(found, sort_keys=True): (params, found) for params, found in prints.values()}.values())


def ray_runner(stack: contextlib.ExitStack, address: str | None, resources: str | None, workers: int | None,
               files: ModelFiles, expected: Expected, keep_models: bool,
               checkpoint_every: int | None = None) -> RayRunner | None:
    """--ray's runner, connected (so a cluster that cannot run the jobs is refused before anything is written)
    and shut down with `stack`; None without --ray."""
    if address is None:
        return None
    from ..batch.ray_runner import RayRunner, parse_resources

    return stack.enter_context(RayRunner(address, files, expected, keep_models=keep_models,
                                         resources=parse_resources(resources), max_workers=workers,
                                         checkpoint_every=checkpoint_every,
                                         warn=lambda line: tqdm.write(line, file=sys.stderr)))


@cli.command("batch")
@click.argument("jobs_file", metavar="JOBS", type=click.Path(dir_okay=False))
@generation_options
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
    width, height, steps, cfg, seed, shift, cache, cache_options, ...; the options below are the defaults) or a
    text file of prompts, one per line, each made once per --seeds seed."""
    files = resolve(model, dit=dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                    t5_tokenizer=t5_tokenizer)
    defaults = batch_defaults(files, **options)
    pipeline = AnimaPipeline(files)
    jobs = read_jobs(jobs_file, defaults, parse_seeds(seeds) if seeds else None, lora_dir)
    expected = check_jobs(jobs, pipeline, jobs_file)
    keep = defaults.backend != "rknn" if keep_models is None else keep_models
    with contextlib.ExitStack() as stack:
        ray = ray_runner(stack, ray_address, ray_resources, ray_workers, files, expected, keep, checkpoint_every)
        results = Results(out, jobs, overwrite=overwrite)
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
                run_local(todo, results, Worker(files, keep), checkpoint_every, bar, publish)
            else:
                ray.run(todo, publish)
    click.echo(f"{len(todo) - len(failed)} images written to {results.folder} ({RESULTS} has every job's record)",
               err=True)
    if failed:
        raise AnimaError(f"{len(failed)} of {len(todo)} jobs failed (first: {failed[0]}); their records say why, "
                         "and running the same command again retries them")


def run_local(jobs: list[BatchJob], results: Results, worker: Worker, checkpoint_every: int | None, bar: tqdm,
              publish: Publish) -> None:
    """In this process; Ctrl-C / SIGTERM stops the running job after its step and keeps its resume state."""
    def on_step(event: StepEvent) -> None:
        bar.set_postfix_str(f"step {event.step}/{event.total}")

    def warn(e: AnimaError) -> None:
        bar.write(f"warning: checkpoint not written (the job goes on): {e}", file=sys.stderr)

    try:
        with stop_on_signals() as stops:
            runner = LocalRunner(worker, results.folder, checkpoint_every=checkpoint_every, stop=lambda: bool(stops),
                                 on_step=on_step, warn=warn)
            runner.run(jobs, publish)
    except Interrupted as e:
        bar.close()
        where = "before its first step" if e.path is None else f"after step {e.step}/{e.total}, its state kept"
        click.echo(f"stopped {where}; run the same command again to continue", err=True)
        sys.exit(128 + stops[0])
