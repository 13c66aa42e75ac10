"""The cache seam (sampling.cache_seam): its size is pinned, a policy that implements it alone runs in the sampler
loop, verify and resume included; a model's cache fit (sampling.cache_fit) is read like any untrusted file; and
auto's options that need a fit, or a sampler where check holds, are refused in one line."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from mixture import cfg_denoiser, initial_noise, make_testbed

from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import GenerationParams
from anima_rknn.model.model_set import DEMO_MODEL
from anima_rknn.sampling.auto_cache import check_refusal, fit_refusal
from anima_rknn.sampling.cache_fit import FIT_FORMAT, fit_path, parse_fit, read_fit, write_fit
from anima_rknn.sampling.cache_seam import CachePolicy, CacheReport, ChecksForecasts
from anima_rknn.sampling.caches import make_cache
from anima_rknn.sampling.rerun import sample_verified
from anima_rknn.sampling.sample import sample
from anima_rknn.sampling.samplers import SAMPLERS
from anima_rknn.sampling.schedule import flow_sigmas

DEMO_DIT = DEMO_MODEL / "split_files" / "diffusion_models" / "anima-demo.safetensors"


def members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")} | set(protocol.__annotations__)


def test_the_seam_is_seven_calls_and_a_report():
    assert members(CachePolicy) == {"name", "num_steps", "set_sigmas", "should_skip", "forecast", "record",
                                    "withdraw_forecast", "state", "restore", "report"}
    assert members(ChecksForecasts) == {"check", "attach_probe"}  # the one optional capability


class EveryOther:
    """A new policy written against the seam alone: compute two calls, then reuse the last x0 on every other one."""

    name = "every-other"

    def __init__(self, num_steps: int) -> None:
        self.num_steps, self.computed, self.skipped, self.last = num_steps, [], [], None

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None:
        pass

    def should_skip(self, x: np.ndarray | None = None) -> bool:
        call = len(self.computed) + len(self.skipped) + 1
        return call > 2 and call % 2 == 1

    def forecast(self, x: np.ndarray) -> np.ndarray:
        self.skipped.append(len(self.computed) + len(self.skipped) + 1)
        return self.last.copy()

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        self.computed.append(len(self.computed) + len(self.skipped) + 1)
        self.last = np.array(x0, copy=True)

    def withdraw_forecast(self) -> None:
        self.skipped.pop()

    def state(self) -> dict[str, Any]:
        return {"computed": list(self.computed), "skipped": list(self.skipped), "last": [self.last]}

    def restore(self, state: dict[str, Any]) -> None:
        self.computed, self.skipped = list(state["computed"]), list(state["skipped"])
        self.last = np.array(state["last"][0], copy=True)

    def report(self) -> CacheReport:
        return CacheReport(list(self.computed), list(self.skipped))


@pytest.fixture(scope="module")
def denoise():
    cond, uncond = make_testbed(dim=16, components=4, std=1.0, seed=0)
    return cfg_denoiser(cond, uncond, 4.0)


def test_a_policy_of_the_seam_alone_runs_resumes_and_passes_verify(denoise):
    noise, sigmas, events = initial_noise(16, [1]), flow_sigmas(10), []
    whole = sample_verified(SAMPLERS["dpmpp_2m"], denoise, noise, sigmas, EveryOther(10), events.append, verify=True)
    assert whole.computed_steps == [1, 2, 4, 6, 8, 10] and whole.skipped_steps == [3, 5, 7, 9]
    assert whole.may_differ is None and whole.rerun_from is None and whole.model_calls == 6
    at = events[4]
    resumed_cache = EveryOther(10)
    resumed_cache.restore(at.cache_state)
    resumed = sample(SAMPLERS["dpmpp_2m"], denoise, at.x, sigmas, resumed_cache, start=5, state=at.sampler_state)
    assert np.array_equal(resumed.latent, whole.latent)
    assert not isinstance(EveryOther(10), ChecksForecasts)


def demo_fit_json() -> dict:
    return json.loads(fit_path(DEMO_DIT).read_text())


def test_the_demo_model_ships_its_fit_and_it_round_trips(tmp_path):
    fit = read_fit(fit_path(DEMO_DIT))
    assert fit.typical_miss == (-3.59, 1.85, 1.77, -0.66) and fit.flag_score == 1.3 and fit.fit_error["typical_miss"]
    write_fit(tmp_path / "copy.cache-fit.json", fit, overwrite=False)
    assert read_fit(tmp_path / "copy.cache-fit.json") == fit
    with pytest.raises(AnimaError, match="exists"):
        write_fit(tmp_path / "copy.cache-fit.json", fit, overwrite=False)


@pytest.mark.parametrize(("change", "named"), [
    ({"format": "other/1"}, "is not an anima-rknn.cache-fit/1"),
    ({"typical_miss": [1, 2, 3]}, "typical_miss must be 4 numbers"),
    ({"typical_miss": [1, 2, 3, "x"]}, "typical_miss must be 4 numbers"),
    ({"flag_score": float("nan")}, "flag_score must be a number"),
    ({"flag_score": True}, "flag_score must be a number"),
    ({"plan_sigma": 1.0}, "plan_sigma must be a number from 0 to 0.999"),
    ({"fit_error": {"x": -1}}, "fit_error must map"),
    ({"fit_error": [1]}, "fit_error must map"),
    ({"dit": "abc"}, "dit a sha256"),
    ({"fitted_on": "x" * 3000}, "fitted_on must be a short text"),
    ({"extra": 1}, "holds exactly"),
])
def test_a_damaged_fit_is_refused_in_one_line(change, named):
    with pytest.raises(AnimaError, match=named) as refused:
        parse_fit({**demo_fit_json(), **change}, "cache fit F")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"[]", b"null", b"1" * 70000])
def test_a_fit_file_that_is_not_one_is_refused_in_one_line(tmp_path, content):
    path = tmp_path / "f.cache-fit.json"
    path.write_bytes(content)
    with pytest.raises(AnimaError, match="cache fit") as refused:
        read_fit(path)
    assert "\n" not in str(refused.value)


def test_without_a_fit_auto_runs_by_tolerance_with_no_flag_and_refuses_the_rest(denoise):
    result = sample(SAMPLERS["euler"], denoise, initial_noise(16, [1]), flow_sigmas(20), make_cache("auto", 20))
    assert result.may_differ is None and result.error_estimate is not None and result.skipped_steps
    for options in ({"budget": 8}, {"budget": 8, "check": True}, {"verify": True}):
        refusal = fit_refusal(options, None)
        assert refusal.startswith(f"cache option {', '.join(options)} of auto needs this model's cache fit")
        assert "calibrate-cache" in refusal
    with pytest.raises(AnimaError, match="needs this model's cache fit"):
        sample(SAMPLERS["euler"], denoise, initial_noise(16, [1]), flow_sigmas(20),
               make_cache("auto", 20, {"budget": 8}))
    assert fit_refusal({"tol": 0.1}, None) is None


@pytest.mark.parametrize("sampler", sorted(set(SAMPLERS) - {"euler"}))
def test_check_is_refused_under_every_sampler_but_euler(sampler):
    """issue 46: budget=10,check=1 under er_sde with s_noise 0 gave 5.6-12.6 dB; check was measured under euler
    alone, so every other sampler is refused, deterministic ones too."""
    settings = {"s_noise": 0.0} if SAMPLERS[sampler].takes_s_noise else {}
    params = GenerationParams(prompt="x", sampler=sampler, cache="auto", cache_options={"budget": 10, "check": True},
                              **settings)
    with pytest.raises(AnimaError, match=f"check holds only under the euler sampler") as refused:
        params.validate()
    assert "--sampler euler" in str(refused.value) and check_refusal("euler") is None
    GenerationParams(prompt="x", sampler=sampler, cache="auto", cache_options={"budget": 10}, **settings).validate()


def test_the_fit_format_is_named():
    assert demo_fit_json()["format"] == FIT_FORMAT
