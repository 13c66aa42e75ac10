"""The sampler registry: every spelling a user may send maps to one of ours, and nothing else does."""

import numpy as np
import pytest
from mixture import model_for

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import SAMPLER_NAMES, SAMPLERS, call_sigmas, sampler_name
from anima_rknn.sampling.schedule import flow_sigmas


def test_every_name_label_and_alias_maps_to_its_sampler_in_any_case():
    for sampler in SAMPLERS.values():
        assert isinstance(sampler.aliases, tuple)  # a bare string would make each of its letters an alias
        for text in (sampler.name, sampler.label, *sampler.aliases):
            assert sampler_name(text) == sampler_name(text.upper()) == sampler_name(text.lower()) == sampler.name


def test_the_names_users_send():
    assert sampler_name("Euler a") == "euler_ancestral"  # webuiapi's default
    assert sampler_name("DPM++ 2M SDE") == "dpmpp_2m_sde"
    assert sampler_name("k_dpmpp_2m") == "dpmpp_2m"
    assert SAMPLER_NAMES[0] == "euler"


@pytest.mark.parametrize("text", ["k", "_", "d", "", "Euler b", "DPM++ 2M Karras", "dpm_fast", None, 3])
def test_a_name_we_do_not_have_is_refused_with_the_list(text):
    with pytest.raises(AnimaError, match=r"unknown sampler .*choose one of euler \(Euler\), euler_ancestral"):
        sampler_name(text)


@pytest.mark.parametrize("name", SAMPLER_NAMES)
@pytest.mark.parametrize("eta, s_noise", [(1.0, 1.0), (0.0, 1.0), (1.0, 0.0)])
def test_a_sampler_says_whether_its_latent_takes_fresh_noise(name, eta, s_noise):
    """What the step caches are told (adds_noise): checked by running the sampler under two noise seeds from the
    same start, which end apart exactly when the steps add noise."""
    sampler, sigmas = SAMPLERS[name], flow_sigmas(6)
    start = np.random.default_rng(0).standard_normal((1, 4, 2, 2)).astype(np.float32)

    def denoise(x, sigma):  # a smooth x0 that depends on the latent, as a model's does
        return np.tanh(0.5 * x).astype(np.float32)

    ends = [sample(sampler, model_for(sampler, denoise), start, sigmas, make_cache("none", len(call_sigmas(sampler, sigmas))),
                   seed=seed, eta=eta, s_noise=s_noise).latent for seed in (1, 2)]
    assert sampler.adds_noise(eta, s_noise) == (not np.array_equal(*ends))
