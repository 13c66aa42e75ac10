"""Inpainting with a base model: the unmasked part of the latent is held on the original's noised trajectory.

A mask wraps the model as a step cache does (k-diffusion style), so every sampler inpaints without knowing it:
at each model call the input's unmasked part is replaced by the original latent noised to that sigma,
(1 - sigma) z + sigma eps with the run's own initial noise eps, and the output's unmasked part by z itself
(ComfyUI's noise mask, comfy/samplers.py KSamplerX0Inpaint). After every step the latent is blended the same way
at the step's new sigma (diffusers' flow-matching inpaint pipelines), so what a step reports, previews and
checkpoints is already the inpainted latent, and the last step's, at sigma 0, is z exactly outside the mask.
Under Euler with a hard mask both blends give the same latent; under a multistep or stochastic sampler the first
keeps what the sampler reads again (its x0 history) consistent with the original, the second its noise. On a soft
edge the model's x0 is mixed with the original's before the step, so the edge moves partway, as in ComfyUI.

The mask is soft (a blurred edge is a partial repaint, linearly mixed), 1 = repaint, at latent resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import AnimaError


@dataclass(frozen=True)
class Inpaint:
    """The original's latent z, the run's initial noise and the latent mask (1 = repaint), all float32; the mask
    broadcasts to z's shape ([1, 1, h, w] for an image latent)."""

    latent: np.ndarray
    noise: np.ndarray
    mask: np.ndarray

    def __post_init__(self) -> None:
        if self.latent.shape != self.noise.shape:
            raise AnimaError(f"inpainting: the latent {list(self.latent.shape)} and the noise "
                             f"{list(self.noise.shape)} differ in shape")
        try:
            fits = np.broadcast_shapes(self.mask.shape, self.latent.shape) == self.latent.shape
        except ValueError:
            fits = False
        if not fits:
            raise AnimaError(f"inpainting: the mask {list(self.mask.shape)} does not fit the latent "
                             f"{list(self.latent.shape)}")

    def known(self, sigma: float) -> np.ndarray:
        """The original's latent on its trajectory at `sigma`."""
        return ((1.0 - sigma) * self.latent + sigma * self.noise).astype(np.float32)

    def blend(self, x: np.ndarray, sigma: float) -> np.ndarray:
        """x inside the mask, the original at `sigma` outside it."""
        return (self.mask * x + (1.0 - self.mask) * self.known(sigma)).astype(np.float32)
