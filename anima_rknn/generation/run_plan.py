"""A run's plan: everything decided about it before any model loads, made once by pipeline.prepare() and taken
by pipeline.generate(). Front ends keep it from the moment they check a run (the server's submission, batch's
driver) to the moment it runs, so the settings are validated and the decisions made once per run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..checks import check_int
from ..engine.vae_plan import DecodePlan
from ..errors import AnimaError
from ..model.model_set import ModelFiles
from .params import MAX_SEED, DenoisePass, GenerationParams

FILLED = ("threads", "vae_tile", "vae_overlap")  # the settings prepare() fills in where they are None


@dataclasses.dataclass(frozen=True)
class PassPlan:
    """One denoising pass: its size, schedule and step cache (`denoise_pass`), and the subgraph set it runs
    (checked against the DiT at its size; None on torch)."""

    denoise_pass: DenoisePass
    subgraphs: Path | None


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """`params`: the validated settings (a copy of the caller's), with what prepare() fills in (threads, the VAE tile
    and overlap; filled in the caller's too, so that its records name them).
    `decode`: how the last pass's picture decodes (and an init image encodes); `first_decode`: the hires fix's first
    pass's picture when Lanczos upscales it (None otherwise: an interrupted first pass decides at its end).
    `fingerprints`: the model files' (pipeline.fingerprints), which resume states and batch job ids hold."""

    files: ModelFiles
    params: GenerationParams
    passes: tuple[PassPlan, ...]
    decode: DecodePlan
    first_decode: DecodePlan | None
    fingerprints: dict[str, str | None]

    @property
    def denoise_passes(self) -> list[DenoisePass]:
        return [each.denoise_pass for each in self.passes]

    def for_settings(self, params: GenerationParams) -> RunPlan:
        """This plan for `params`, which differ from its settings in the seed alone (a request's or a batch's images
        of one setting, generate --batch-count): no decision depends on the seed, so one prepare() serves them all.
        A copy of `params` takes what prepare() filled in."""
        filled = dataclasses.replace(params, **{name: getattr(self.params, name) for name in FILLED})
        if dataclasses.replace(filled, seed=self.params.seed) != self.params:
            raise AnimaError("a run plan serves only settings that differ from its own in the seed")
        check_int("seed", filled.seed, 0, MAX_SEED)
        return dataclasses.replace(self, params=filled)

    def check_files(self, files: ModelFiles) -> None:
        """A plan runs on the model files it was made for."""
        if files != self.files:
            raise AnimaError(f"this run was prepared for {self.files.dit.name}, not {files.dit.name}: prepare it "
                             "on the pipeline that runs it")
