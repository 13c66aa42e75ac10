"""Runs the uncached baseline and each cached policy with identical settings: one prompt encoding shared by
all runs, the same loaded weights, the same noise per seed, repeats interleaved so drift hits both sides."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from ..core.memory import peak_rss
from ..errors import AnimaError
from ..generation.params import GenerationParams
from ..generation.pipeline import AnimaPipeline
from ..generation.result import Conditioning, DecodePlan, Denoised
from ..sampling.caches import CACHE_NAMES, make_cache
from ..sampling.sample import StepCallback, StepEvent

BASELINE = "baseline"
# Every run keeps its per-step x0 for the report, so the number of runs is bounded.
MAX_SEEDS, MAX_REPEATS = 64, 100
# on_run(seed, side, repeat): called before each run; side is "baseline" or a cache name, repeat is 0-based.
RunCallback = Callable[[int, str, int], None]


@dataclass
class Run:
    """One denoise + decode: the time of each, the peak RSS over both, and each step's time and x0."""

    denoised: Denoised
    image: Image.Image | None  # None when the latent is not finite (never decoded)
    decode_s: float
    peak_rss_bytes: int | None
    step_times: list[float]  # wall seconds per step
    x0_history: list[np.ndarray]  # the x0 each step used

    @property
    def total_s(self) -> float:
        """End to end excluding the prompt encoding, which every run shares: denoise + decode."""
        return self.denoised.denoise_s + self.decode_s


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


def policy_params(params: GenerationParams, caches: Sequence[str],
                  cache_options: dict[str, float | str | bool]) -> dict[str, GenerationParams]:
    """Each cached policy's settings, checked before any work is done (the baseline's is `params` with
    cache none and no options)."""
    params.validate()
    for name in caches:
        make_cache(name, params.steps, cache_options)  # raises on options the policy doesn't take
    return {name: dataclasses.replace(params, cache=name, cache_options=dict(cache_options)) for name in caches}


def _run(pipeline: AnimaPipeline, conditioning: Conditioning, params: GenerationParams, plan: DecodePlan,
         on_step: StepCallback | None) -> Run:
    events: list[StepEvent] = []

    def listen(event: StepEvent) -> None:
        events.append(event)
        if on_step is not None:
            on_step(event)

    with peak_rss() as peak:
        denoised = pipeline.denoise(conditioning, params, on_step=listen)
        image, decode_s = None, 0.0
        if denoised.sample.finite:
            image, decode_s = pipeline.decode(denoised.sample.latent, plan, params.rknn)
    return Run(denoised, image, decode_s, peak.bytes, [e.seconds for e in events], [e.x0.copy() for e in events])


@dataclass(frozen=True)
class Sweep:
    """What bench runs at each seed: the baseline (cache none) and each cached policy, `repeats` times each."""

    caches: tuple[str, ...]
    cache_options: dict[str, float | str | bool] = field(default_factory=dict)
    repeats: int = 1


class SeedBench:
    """One pipeline benching one setting seed by seed: checked, encoded and warmed up once, at the start.

    The unit of work the batch runners hand a worker (batch.worker.Worker.bench), locally or over Ray: each seed's
    baseline and cached runs are made by one worker, one after another, so their timings compare. Build the
    pipeline with keep_dit=True so the DiT is loaded once for all runs."""

    def __init__(self, pipeline: AnimaPipeline, params: GenerationParams, sweep: Sweep) -> None:
        if sweep.repeats < 1:
            raise AnimaError(f"--repeat must be at least 1, got {sweep.repeats}")
        self.pipeline, self.sweep = pipeline, sweep
        self.baseline = dataclasses.replace(params, cache="none", cache_options={})
        self.cached = policy_params(params, sweep.caches, sweep.cache_options)
        self.plan = pipeline.prepare(params)
        with peak_rss() as encode_peak:
            self.conditioning = pipeline.encode(params.prompt, params.negative, params.dtype, params.loras,
                                                params.lora_ignore_unmatched)
        self.encode_peak_rss_bytes = encode_peak.bytes
        # Untimed: torch's first-call costs (allocator, kernel choice) would otherwise land on the baseline alone.
        pipeline.denoise(self.conditioning, dataclasses.replace(self.baseline, steps=1))

    def takes(self, params: GenerationParams, sweep: Sweep) -> bool:
        """Whether `params` is this bench's setting at another seed."""
        return sweep == self.sweep and dataclasses.replace(params, cache="none", cache_options={},
                                                           seed=self.baseline.seed) == self.baseline

    def run(self, seed: int, on_run: RunCallback | None = None, on_step: StepCallback | None = None) -> BenchResult:
        """Every side at `seed`, repeats interleaved so that drift hits all sides alike."""
        # "baseline" is no cache name, so a cached "none" stays a second, separate run of the same thing.
        sides = {BASELINE: self.baseline, **self.cached}
        runs: dict[str, list[Run]] = {label: [] for label in sides}
        for repeat in range(self.sweep.repeats):
            for label, side in sides.items():
                if on_run is not None:
                    on_run(seed, label, repeat)
                runs[label].append(_run(self.pipeline, self.conditioning, dataclasses.replace(side, seed=seed),
                                        self.plan, on_step))
        per_side = {label: PolicyRuns(dataclasses.replace(sides[label], seed=seed), runs[label]) for label in sides}
        return BenchResult(self.conditioning, self.encode_peak_rss_bytes, self.sweep.repeats,
                           [SeedResult(seed, per_side.pop(BASELINE), per_side)], self.plan)


def merge(results: Sequence[BenchResult]) -> BenchResult:
    """One report's result from per-seed ones (in the order given), made by one worker or several."""
    peaks = [r.encode_peak_rss_bytes for r in results if r.encode_peak_rss_bytes is not None]
    first = results[0]
    return BenchResult(first.conditioning, max(peaks) if peaks else None, first.repeats,
                       [seed for result in results for seed in result.seeds], first.decode)


def run_bench(pipeline: AnimaPipeline, params: GenerationParams, caches: Sequence[str],
              cache_options: dict[str, float | str | bool] | None = None, seeds: Sequence[int] | None = None,
              repeats: int = 1, *, on_run: RunCallback | None = None,
              on_step: StepCallback | None = None) -> BenchResult:
    """Baseline (cache none) vs each of `caches` at every seed (default: params.seed), `repeats` times each,
    in this process. `params.cache` is ignored."""
    bench = SeedBench(pipeline, params, Sweep(tuple(caches), dict(cache_options or {}), repeats))
    return merge([bench.run(seed, on_run, on_step) for seed in (seeds or [params.seed])])
