"""The PNG `parameters` of the sampler settings, as A1111 writes them: its display name, and eta / s_noise under
A1111's keys only when they are not the default of 1."""

from __future__ import annotations

import pytest

from anima_rknn.generation.params import GenerationParams
from anima_rknn.generation.result import png_parameters
from anima_rknn.sampling.samplers import SAMPLERS


def _fields(params: GenerationParams) -> list[str]:
    return png_parameters(params, "anima.safetensors").split("\n")[-1].split(", ")


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_the_sampler_is_named_by_its_a1111_label(sampler):
    fields = _fields(GenerationParams(prompt="x", sampler=sampler))
    assert fields[:3] == ["Steps: 20", f"Sampler: {SAMPLERS[sampler].label}", "Schedule type: Simple"]


@pytest.mark.parametrize("eta, s_noise, written", [
    (None, None, []), (1.0, 1.0, []), (0.25, None, ["Eta: 0.25"]), (None, 0.5, ["Sigma noise: 0.5"]),
    (0.0, 1.5, ["Eta: 0.0", "Sigma noise: 1.5"])])
def test_eta_and_s_noise_are_written_only_when_not_the_default(eta, s_noise, written):
    fields = _fields(GenerationParams(prompt="x", sampler="dpmpp_2m_sde", eta=eta, s_noise=s_noise))
    assert [f for f in fields if f.startswith(("Eta", "Sigma noise"))] == written
    assert fields.index("Model: anima.safetensors") < fields.index("Shift: 3.0")  # A1111's order: extras after
