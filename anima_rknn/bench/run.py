"""Runs the uncached baseline and each cached policy with identical settings: one prompt encoding shared by
all runs, the same loaded weights, the same noise per seed, repeats interleaved so drift hits both sides.

A sweep may name several samplers: each is a setting of its own, with its own uncached baseline that its cached
runs are measured against (a sampler's picture is not another's), all at the same seeds from the same encoding.

Image to image benches as text to image does: every run encodes the init image and denoises the truncated schedule
(a cache caches over the steps run); with the hires fix a run is both passes, its step times and x0 those of every
step of both, numbered through (the hires pass's after the first's), its cached sides caching both passes unless
--hires-cache says otherwise, the baseline neither."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from ..core.memory import peak_rss
from ..errors import AnimaError
from ..generation.params import GenerationParams, uncached
from ..generation.pipeline import AnimaPipeline
from ..engine.vae_plan import DecodePlan
from ..generation.result import Conditioning, Denoised
from ..generation.run_plan import RunPlan
from ..sampling.caches import CACHE_NAMES, make_cache
from ..sampling.sample import StepCallback, StepEvent
from ..sampling.samplers import sampler_name

BASELINE = "baseline"
# Every run keeps its per-step x0 for the report, so the number of runs is bounded.
MAX_SEEDS, MAX_REPEATS = 64, 100
# on_run(seed, side, repeat): called before each run; side is "baseline" or a cache name, repeat is 0-based.
RunCallback = Callable[[int, str, int], None]


@dataclass
class Run:
    """One run, every pass + decode: the time of each, the peak RSS over all, and each step's time and x0 (the
    steps of every pass, in order)."""

    denoised: Denoised  # the pass that made the picture (the only one, or the hires fix's second)
    image: Image.Image | None  # None when the latent is not finite (never decoded)
    decode_s: float
    peak_rss_bytes: int | None
    step_times: list[float]  # wall seconds per step (a step verify ran again: both times)
    x0_history: list[np.ndarray]  # the x0 each step used (verify's re-run: the re-run's)
    # The steps (1-based) where a forecast stood in for a model call (the sample's skipped_steps number model calls,
    # which are the steps only for samplers that call the model once a step).
    forecast_steps: list[int] = field(default_factory=list)
    first_pass: Denoised | None = None  # the hires fix's first pass
    vae_encode_s: float = 0.0  # the init image's VAE encode (and a Lanczos hires fix's)

    @property
    def denoised_passes(self) -> list[Denoised]:
        """Every pass this run made, in order."""
        return [self.denoised] if self.first_pass is None else [self.first_pass, self.denoised]

    @property
    def denoise_s(self) -> float:
        return sum(d.denoise_s for d in self.denoised_passes)

    @property
    def total_s(self) -> float:
        """End to end excluding the prompt encoding, which every run shares: VAE encode + denoise + decode."""
        return self.vae_encode_s + self.denoise_s + self.decode_s


@dataclass
class PolicyRuns:
    """All repeats of one cache policy at one seed; their outputs are identical, their timings are not."""

    params: GenerationParams
    runs: list[Run]

    @property
    def first(self) -> Run:
        return self.runs[0]


@dataclass
class SeedResult:
    seed: int
    baseline: PolicyRuns
    cached: dict[str, PolicyRuns]  # by cache name, in the order asked for
    worker: str | None = None  # host:pid of the batch worker that ran this seed; None: this process
    sampler: str = "euler"  # the sampler of every side (a sweep of several samplers has a SeedResult for each)


@dataclass
class BenchResult:
    conditioning: Conditioning
    encode_peak_rss_bytes: int | None
    repeats: int
    seeds: list[SeedResult]
    decode: DecodePlan  # how every decode ran (tile, VAE backend)


def parse_cache_list(text: str) -> list[str]:
    """"spectrum,spectrum-plus,reuse" -> the names, checked."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise AnimaError("--cache needs at least one cache policy")
    for name in names:
        if name not in CACHE_NAMES:
            raise AnimaError(f"unknown cache {name!r}; choose from {', '.join(CACHE_NAMES)}")
    if len(set(names)) != len(names):
        raise AnimaError(f"a cache policy is listed twice in {text!r}")
    return names


def parse_sampler_list(text: str) -> list[str]:
    """"euler,dpmpp_2m_sde,Euler a" -> our names (A1111's display names taken too), checked."""
    names = [sampler_name(name.strip()) for name in text.split(",") if name.strip()]
    if not names:
        raise AnimaError("--sampler needs at least one sampler")
    if len(set(names)) != len(names):
        raise AnimaError(f"a sampler is listed twice in {text!r}")
    return names


def sampler_params(params: GenerationParams, samplers: Sequence[str]) -> dict[str, GenerationParams]:
    """`params` for each of `samplers`, by name (eta and s_noise as given: every sampler listed must have them)."""
    return {sampler: dataclasses.replace(params, sampler=sampler) for sampler in samplers}


def policy_params(params: GenerationParams, caches: Sequence[str],
                  cache_options: dict[str, float | str | bool]) -> dict[str, GenerationParams]:
    """Each cached policy's settings, checked before any work is done (the baseline's is `params` with
    cache none and no options)."""
    params.validate()
    for name in caches:
        make_cache(name, params.model_calls(), cache_options)  # raises on options the policy doesn't take
    return {name: dataclasses.replace(params, cache=name, cache_options=dict(cache_options)) for name in caches}


def _run(pipeline: AnimaPipeline, conditioning: Conditioning, plan: RunPlan, on_step: StepCallback | None) -> Run:
    events: list[StepEvent] = []

    def listen(event: StepEvent) -> None:
        events.append(event)
        if on_step is not None:
            on_step(event)

    with peak_rss() as peak:
        rendered = pipeline.render(conditioning, plan, on_step=listen)
    # verify's re-run goes back over steps: each step's x0 and forecast flag are those of its last event (the run
    # that made the image), its time that of all of them
    last = {e.step: e for e in events}
    seconds = {step: sum(e.seconds for e in events if e.step == step) for step in last}
    return Run(rendered.denoised, rendered.image, rendered.decode_s, peak.bytes, list(seconds.values()),
               [e.x0.copy() for e in last.values()], [step for step, e in last.items() if not e.computed],
               rendered.first_pass, rendered.vae_encode_s)


@dataclass(frozen=True)
class Sweep:
    """What bench runs at each seed: the baseline (cache none) and each cached policy, `repeats` times each, for
    each of `samplers` (none named: the setting's own)."""

    caches: tuple[str, ...]
    cache_options: dict[str, float | str | bool] = field(default_factory=dict)
    repeats: int = 1
    samplers: tuple[str, ...] = ()

    def check(self, params: GenerationParams) -> None:
        """Every side's settings, before any work is done."""
        for each in sampler_params(params, self.samplers or (params.sampler,)).values():
            policy_params(each, self.caches, self.cache_options)


class SeedBench:
    """One pipeline benching one setting seed by seed: checked, encoded and warmed up once, at the start.

    What a batch worker keeps between the seeds SweepTask hands it, locally or over Ray: each seed's baseline and
    cached runs are made by one worker, one after another, so their timings compare. Build the pipeline with
    keep_dit=True so the DiT is loaded once for all runs."""

    def __init__(self, pipeline: AnimaPipeline, params: GenerationParams, sweep: Sweep) -> None:
        if sweep.repeats < 1:
            raise AnimaError(f"--repeat must be at least 1, got {sweep.repeats}")
        self.pipeline, self.sweep = pipeline, sweep
        self.baseline = uncached(params)
        # Per sampler: its baseline ("baseline" is no cache name, so a cached "none" stays a second, separate run
        # of the same thing), then each cached policy.
        self.sides = {sampler: {BASELINE: uncached(each),
                                **policy_params(each, sweep.caches, sweep.cache_options)}
                      for sampler, each in sampler_params(params, sweep.samplers or (params.sampler,)).items()}
        self.plan = pipeline.prepare(params)
        # Each side is a run of its own (its cache, its sampler), planned once for all seeds; validated above.
        self.plans = {(sampler, label): pipeline.prepare(side, validated=True)
                      for sampler, sides in self.sides.items() for label, side in sides.items()}
        with peak_rss() as encode_peak:
            self.conditioning = pipeline.encode(params.prompt, params.negative, params.dtype, params.loras,
                                                params.lora_ignore_unmatched)
        self.encode_peak_rss_bytes = encode_peak.bytes
        # Untimed: torch's first-call costs (allocator, kernel choice) would otherwise land on the baseline alone;
        # one text-to-image step at the first pass's size.
        pipeline.denoise(self.conditioning, dataclasses.replace(self.baseline, steps=1, init_image=None, mask=None,
                                                                outpaint=None, hires=False))

    def takes(self, params: GenerationParams, sweep: Sweep) -> bool:
        """Whether `params` is this bench's setting at another seed."""
        return sweep == self.sweep and dataclasses.replace(uncached(params), seed=self.baseline.seed) == self.baseline

    def run(self, seed: int, on_run: RunCallback | None = None, on_step: StepCallback | None = None) -> BenchResult:
        """Every side at `seed` (one SeedResult per sampler), repeats interleaved so that drift hits all sides
        alike. on_run's side is "baseline" or the cache name, with the sampler before it ("heun baseline") when
        the sweep has several."""
        several = len(self.sides) > 1
        runs: dict[tuple[str, str], list[Run]] = {(s, label): [] for s, sides in self.sides.items() for label in sides}
        for repeat in range(self.sweep.repeats):
            for (sampler, label), done in runs.items():
                if on_run is not None:
                    on_run(seed, f"{sampler} {label}" if several else label, repeat)
                side = self.plans[sampler, label].for_settings(dataclasses.replace(self.sides[sampler][label],
                                                                                   seed=seed))
                done.append(_run(self.pipeline, self.conditioning, side, on_step))
        seeds = []
        for sampler, sides in self.sides.items():
            per_side = {label: PolicyRuns(dataclasses.replace(side, seed=seed), runs[sampler, label])
                        for label, side in sides.items()}
            seeds.append(SeedResult(seed, per_side.pop(BASELINE), per_side, sampler=sampler))
        return BenchResult(self.conditioning, self.encode_peak_rss_bytes, self.sweep.repeats, seeds, self.plan.decode)


@dataclass(frozen=True)
class SweepTask:
    """One seed of a bench sweep, as a batch worker runs it (batch.worker.Task): the baseline and each cached
    policy at the job's seed, timed on that worker. The prompt is encoded and torch warmed up once for all the
    seeds of one setting a worker gets (the SeedBench it keeps). `on_run` only where the worker is in this
    process (it does not travel to a Ray worker)."""

    sweep: Sweep
    on_run: RunCallback | None = None

    def run(self, pipeline: AnimaPipeline, params: GenerationParams, kept: Any,
            on_step: StepCallback | None) -> tuple[BenchResult, SeedBench]:
        bench = kept if isinstance(kept, SeedBench) and kept.takes(params, self.sweep) \
            else SeedBench(pipeline, params, self.sweep)
        return bench.run(params.seed, self.on_run, on_step), bench


def merge(results: Sequence[BenchResult]) -> BenchResult:
    """One report's result from per-seed ones (in the order given), made by one worker or several."""
    peaks = [r.encode_peak_rss_bytes for r in results if r.encode_peak_rss_bytes is not None]
    first = results[0]
    return BenchResult(first.conditioning, max(peaks) if peaks else None, first.repeats,
                       [seed for result in results for seed in result.seeds], first.decode)


def run_bench(pipeline: AnimaPipeline, params: GenerationParams, caches: Sequence[str],
              cache_options: dict[str, float | str | bool] | None = None, seeds: Sequence[int] | None = None,
              repeats: int = 1, *, samplers: Sequence[str] = (), on_run: RunCallback | None = None,
              on_step: StepCallback | None = None) -> BenchResult:
    """Baseline (cache none) vs each of `caches` at every seed (default: params.seed), `repeats` times each,
    for each of `samplers` (default: params.sampler), in this process. `params.cache` is ignored."""
    bench = SeedBench(pipeline, params, Sweep(tuple(caches), dict(cache_options or {}), repeats, tuple(samplers)))
    return merge([bench.run(seed, on_run, on_step) for seed in (seeds or [params.seed])])
