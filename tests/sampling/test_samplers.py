"""The sampler registry: every spelling a user may send maps to one of ours, and nothing else does."""

import pytest

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.samplers import SAMPLER_NAMES, SAMPLERS, sampler_name


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


@pytest.mark.parametrize("text", ["k", "_", "d", "", "Euler b", "DPM++ 2M Karras", "uni_pc", None, 3])
def test_a_name_we_do_not_have_is_refused_with_the_list(text):
    with pytest.raises(AnimaError, match=r"unknown sampler .*choose one of euler \(Euler\), euler_ancestral"):
        sampler_name(text)
