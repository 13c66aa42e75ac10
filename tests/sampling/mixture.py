"""A closed-form test bed for samplers and step caches.

For data drawn from an isotropic Gaussian mixture the exact flow-matching denoiser E[x0 | x_t] is
analytic, so a sampler driven by it follows real diffusion trajectories and the error a step cache
adds can be measured without any trained network.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import Denoiser, sample
from anima_rknn.sampling.samplers import SAMPLERS, Sampler
from anima_rknn.sampling.schedule import flow_sigmas


class GaussianMixture:
    """sum_k weights[k] * N(means[k], std^2 I) in D dimensions."""

    def __init__(self, means: np.ndarray, std: float, weights: np.ndarray | None = None) -> None:
        self.means = np.asarray(means, dtype=np.float64)
        if self.means.ndim != 2:
            raise AnimaError(f"mixture means must be [components, dim], got shape {self.means.shape}")
        if not std > 0:
            raise AnimaError(f"mixture std must be positive, got {std!r}")
        self.std = float(std)
        count = len(self.means)
        weights = np.full(count, 1.0 / count) if weights is None else np.asarray(weights, dtype=np.float64)
        if weights.shape != (count,) or (weights < 0).any() or weights.sum() <= 0:
            raise AnimaError("mixture weights must be one non-negative number per component, not all zero")
        self.weights = weights / weights.sum()

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        components = rng.choice(len(self.means), size=n, p=self.weights)
        return self.means[components] + self.std * rng.standard_normal((n, self.dim))

    def denoise(self, x_t: np.ndarray, sigma: float) -> np.ndarray:
        """E[x0 | x_t] for x_t = (1 - sigma) x0 + sigma eps, eps ~ N(0, I); x_t is [..., D]."""
        x_t = np.asarray(x_t, dtype=np.float64)
        sigma = float(np.clip(sigma, 0.0, 1.0))
        scale = 1.0 - sigma
        # Given component k, x_t ~ N(scale * mean_k, variance I) with the same variance for every k.
        variance = scale**2 * self.std**2 + sigma**2
        # log p(k | x_t) up to a constant: the ||x_t||^2 term is the same for all k and drops out.
        logits = np.log(np.maximum(self.weights, 1e-300)) + (
            scale * x_t @ self.means.T - 0.5 * scale**2 * np.sum(self.means**2, axis=1)) / variance
        logits -= logits.max(axis=-1, keepdims=True)
        posterior = np.exp(logits)
        posterior /= posterior.sum(axis=-1, keepdims=True)
        # Per component E[x0 | x_t, k] = mean_k + (scale std^2 / variance)(x_t - scale mean_k).
        return (sigma**2 / variance) * (posterior @ self.means) + (scale * self.std**2 / variance) * x_t


def make_testbed(dim: int = 64, components: int = 8, std: float = 0.35,
                 seed: int = 0) -> tuple[GaussianMixture, GaussianMixture]:
    """(conditional, unconditional) mixtures: the unconditional one has `components` unit-normal means
    with equal weights; the conditional one keeps a random quarter of them, unevenly weighted, as a
    prompt narrows what a model draws."""
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((components, dim))
    unconditional = GaussianMixture(means, std)
    kept = rng.choice(components, size=max(1, components // 4), replace=False)
    conditional = GaussianMixture(means[kept], std, rng.dirichlet(np.ones(len(kept))))
    return conditional, unconditional


class CfgDenoiser:
    """The guided x0 a sampler sees: CFG on x0, which equals CFG on v at the same sigma; `pair` is a guided
    sampler's model (guided x0, unconditional x0)."""

    def __init__(self, cond: GaussianMixture, uncond: GaussianMixture, scale: float) -> None:
        self.cond, self.uncond, self.scale = cond, uncond, scale

    def __call__(self, x: np.ndarray, sigma: float) -> np.ndarray:
        return self.pair(x, sigma)[0]

    def pair(self, x: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        x0_uncond = self.uncond.denoise(x, sigma)
        guided = x0_uncond + self.scale * (self.cond.denoise(x, sigma) - x0_uncond)
        return guided.astype(np.float32), x0_uncond.astype(np.float32)


def cfg_denoiser(cond: GaussianMixture, uncond: GaussianMixture, scale: float) -> CfgDenoiser:
    return CfgDenoiser(cond, uncond, scale)


def model_for(sampler: Sampler, denoise: Denoiser) -> Denoiser:
    """`denoise` as `sampler` takes it: a guided sampler's returns (guided x0, unconditional x0), a CfgDenoiser's
    pair, or for any other denoiser the one x0 twice (CFG off, as the pipeline's at CFG 1)."""
    if not sampler.guided:
        return denoise
    if isinstance(denoise, CfgDenoiser):
        return denoise.pair

    def twice(x: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        x0 = denoise(x, sigma)
        return x0, x0

    return twice


def initial_noise(dim: int, seeds: Sequence[int]) -> np.ndarray:
    """One float32 noise row per seed, each drawn from its own generator so rows don't depend on the batch."""
    return np.stack([np.random.default_rng(seed).standard_normal(dim) for seed in seeds]).astype(np.float32)


def relative_errors(cache_name: str, cond: GaussianMixture, uncond: GaussianMixture, cfg_scale: float,
                    steps: int, seeds: Sequence[int], options: dict[str, float | str | bool] | None = None,
                    shift: float = 3.0, calls: list[int] | None = None) -> np.ndarray:
    """Per seed ||x_cache - x_none|| / ||x_none|| of the final samples, both runs from the same noise;
    `calls`, when given, receives each seed's number of computed steps.

    The fixed schedules run all seeds as one batch: their schedule and forecast weights don't depend on the
    values, so each row is what a run of that seed alone would give (up to rounding). A cache that measures
    its forecasts (error_estimate not None) decides from the values, so it runs one seed at a time.
    """
    denoise = cfg_denoiser(cond, uncond, cfg_scale)
    noise = initial_noise(uncond.dim, seeds)
    sigmas = flow_sigmas(steps, shift)
    reference = sample(SAMPLERS["euler"], denoise, noise, sigmas, make_cache("none", steps)).latent
    measures = make_cache(cache_name, steps, options).report().error_estimate is not None
    runs = [sample(SAMPLERS["euler"], denoise, rows, sigmas, make_cache(cache_name, steps, options))
            for rows in (noise[:, None] if measures else [noise])]
    if calls is not None:
        calls.extend(len(r.computed_steps) for r in runs for _ in range(len(r.latent)))
    cached = np.concatenate([r.latent for r in runs])
    return np.linalg.norm(cached - reference, axis=1) / np.linalg.norm(reference, axis=1)
