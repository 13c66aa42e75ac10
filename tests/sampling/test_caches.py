import numpy as np
import pytest
from mixture import make_testbed, relative_errors

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.caches import CACHE_NAMES, make_cache, parse_cache_options
from anima_rknn.sampling.schedule import flow_sigmas


def run_schedule(cache, values):
    """Drive a cache through len(values) model calls, as the sampler loop does, the latent asked about being the
    value itself; return the x0 it handed back on each skipped call."""
    cache.set_sigmas(flow_sigmas(len(values)))
    forecasts = {}
    for step, value in enumerate(values, start=1):
        if cache.should_skip():
            forecasts[step] = cache.forecast(value)
        else:
            cache.record(value, value)
    return forecasts


def test_cache_names():
    assert CACHE_NAMES == ("none", "spectrum", "spectrum-plus", "reuse", "auto")


def test_none_never_skips():
    cache = make_cache("none", 20)
    run_schedule(cache, [np.zeros(2, np.float32)] * 20)
    assert cache.computed_steps == list(range(1, 21)) and cache.skipped_steps == []


@pytest.mark.parametrize("steps", [20, 30])
def test_spectrum_plus_and_reuse_compute_the_same_steps_as_spectrum(steps):
    values = [np.full(3, float(i), np.float32) for i in range(steps)]
    caches = [make_cache(name, steps) for name in ("spectrum", "spectrum-plus", "reuse")]
    for cache in caches:
        run_schedule(cache, values)
    assert caches[0].computed_steps == caches[1].computed_steps == caches[2].computed_steps
    assert caches[0].skipped_steps == caches[1].skipped_steps == caches[2].skipped_steps


def test_reuse_returns_the_last_computed_x0_unchanged():
    values = [np.full((2, 2), float(step), np.float16) for step in range(1, 21)]
    cache = make_cache("reuse", 20)
    forecasts = run_schedule(cache, values)
    for step, forecast in forecasts.items():
        last_computed = max(s for s in cache.computed_steps if s < step)
        assert forecast.dtype == np.float16 and np.array_equal(forecast, values[last_computed - 1])


def test_spectrum_plus_options_override_its_defaults():
    cache = make_cache("spectrum-plus", 20, {"w": 0.5, "taylor": "fractional"})
    assert cache.w == 0.5 and cache.taylor == "fractional"
    assert make_cache("spectrum", 20).w == 0.4


@pytest.mark.parametrize("name", ["spectrum", "spectrum-plus", "reuse"])
def test_withdrawn_forecast_becomes_a_computed_step(name):
    cache = make_cache(name, 20)
    zero = np.zeros(1, np.float32)
    for _ in range(4):
        cache.record(zero, zero)
    assert cache.should_skip()
    cache.forecast(zero)
    cache.withdraw_forecast()
    cache.record(zero, zero)
    assert cache.computed_steps == [1, 2, 3, 4, 5] and cache.skipped_steps == []


def test_parse_sd_cpp_option_string():
    options = parse_cache_options("w=0.4,m=3,lam=1.0,window=2,flex=0.5,warmup=4,stop=0.9")
    assert options == {"w": 0.4, "m": 3, "lam": 1.0, "window": 2, "flex": 0.5, "warmup": 4, "stop": 0.9}
    assert type(options["m"]) is int and type(options["w"]) is float
    assert parse_cache_options(" normalize=true, tau_axis=steps ,taylor=fractional,") == {
        "normalize": True, "tau_axis": "steps", "taylor": "fractional"}
    assert parse_cache_options("") == {}


@pytest.mark.parametrize("text, named", [
    ("alpha=1", "alpha"), ("m=3.5", "m"), ("w=high", "w"), ("warmup", "warmup"), ("normalize=maybe", "normalize"),
    ("w=0.1,w=0.2", "w"), ("stop=", "stop"),
])
def test_bad_option_strings_name_the_culprit(text, named):
    with pytest.raises(AnimaError, match=named):
        parse_cache_options(text)


@pytest.mark.parametrize("name, options", [
    ("lru", None), ("none", {"w": 0.1}), ("reuse", {"w": 0.1}), ("spectrum", {"w": 2.0}),
    ("spectrum", {"alpha": 1.0}), ("spectrum-plus", {"tau_axis": "sigma"}), ("reuse", {"window": 0}),
])
def test_bad_caches_rejected(name, options):
    with pytest.raises(AnimaError):
        make_cache(name, 20, options)


# Gaussian-mixture test bed: 64 dims, seeds 0-31 (all runs batched, well under a second).
# (CFG scale, component std, components) -> faithful median error measured at 20 and 30 steps.
FAITHFUL_MEDIANS = {
    (4.0, 0.35, 8): (0.0415, 0.0520),
    (4.0, 1.0, 8): (0.1065, 0.1150),
    (1.0, 1.0, 8): (0.0988, 0.1190),
    (1.0, 0.1, 64): (0.0068, 0.0129),
    (7.0, 0.5, 16): (0.0612, 0.0723),
}


@pytest.fixture(scope="module")
def testbed_medians():
    medians = {}
    for (cfg_scale, std, components) in FAITHFUL_MEDIANS:
        cond, uncond = make_testbed(64, components, std, seed=0)
        for steps in (20, 30):
            for name in ("reuse", "spectrum", "spectrum-plus"):
                errors = relative_errors(name, cond, uncond, cfg_scale, steps, range(32))
                medians[cfg_scale, std, components, steps, name] = float(np.median(errors))
    return medians


@pytest.mark.parametrize("mixture", list(FAITHFUL_MEDIANS))
def test_faithful_spectrum_error_is_pinned(testbed_medians, mixture):
    # Regression guard on the faithful port: its error comes from documented quirks (fixed 0..50 tau
    # axis, ridge shrinkage, half-step Taylor), so it should stay where it was measured, within 20%
    # either way; a big drop would mean someone "fixed" the faithful default instead of adding an option.
    for steps, measured in zip((20, 30), FAITHFUL_MEDIANS[mixture]):
        assert 0.8 * measured < testbed_medians[(*mixture, steps, "spectrum")] < 1.2 * measured


@pytest.mark.parametrize("mixture", list(FAITHFUL_MEDIANS))
@pytest.mark.parametrize("steps", [20, 30])
def test_spectrum_plus_beats_faithful_and_reuse(testbed_medians, mixture, steps):
    plus = testbed_medians[(*mixture, steps, "spectrum-plus")]
    assert plus < testbed_medians[(*mixture, steps, "spectrum")]
    assert plus < testbed_medians[(*mixture, steps, "reuse")]


# ---- hostile option strings: parse + build never raise anything but AnimaError, and memory stays bounded ----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from anima_rknn.sampling.caches import OPTION_TYPES  # noqa: E402
from anima_rknn.sampling.spectrum import MAX_DEGREE  # noqa: E402

_VALUES = st.sampled_from(["nan", "inf", "-inf", "1e999", "-1", "0", "1", "2.5", "99999999999999999999", "true",
                           "no", "steps", "fixed50", "half", "fractional", "", " ", "=", "0x10", "1_000"])
_ITEMS = st.tuples(st.sampled_from(list(OPTION_TYPES) + ["bogus", "", "W"]), _VALUES | st.text(max_size=8))
OPTION_TEXT = st.lists(_ITEMS, max_size=8).map(lambda items: ",".join(f"{k}={v}" for k, v in items)) | st.text(max_size=60)


@settings(max_examples=400, deadline=None)
@given(OPTION_TEXT, st.sampled_from(CACHE_NAMES), st.integers(min_value=1, max_value=60))
def test_any_option_string_builds_a_cache_or_raises_anima_error(text, name, steps):
    try:
        cache = make_cache(name, steps, parse_cache_options(text))
    except AnimaError:
        return
    history = getattr(getattr(cache, "spectrum", None), "history_len", 0)
    assert history <= max(MAX_DEGREE + 1, 6)
    values = [np.full(4, float(i), dtype=np.float32) for i in range(steps)]
    forecasts = run_schedule(cache, values)  # runs a whole schedule without error
    assert all(np.isfinite(f).all() for f in forecasts.values())


@pytest.mark.parametrize("text, pattern", [
    ("m=1000000000", "m must be an integer from 0 to 8"),
    ("w=nan", "w must be in"), ("lam=inf", "lam must be in"), ("stop=nan", "stop must be in"),
    ("flex=1e308", "flex must be in"), ("window=0", "window must be an integer from 1"),
])
def test_out_of_range_options_are_refused(text, pattern):
    with pytest.raises(AnimaError, match=pattern):
        make_cache("spectrum", 20, parse_cache_options(text))
