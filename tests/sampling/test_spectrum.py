import numpy as np
import pytest

from anima_rknn.errors import AnimaError
from anima_rknn.sampling.spectrum import Spectrum


def drive(spectrum: Spectrum, signal, shape=(3,), dtype=np.float32) -> dict[int, np.ndarray]:
    """Run a whole schedule on signal(step) (1-based); return the forecast made for each skipped step."""
    forecasts = {}
    for step in range(1, spectrum.num_steps + 1):
        if spectrum.should_skip():
            forecasts[step] = spectrum.forecast(np.zeros(shape, dtype))  # the latent: Spectrum never reads it
        else:
            value = np.broadcast_to(np.asarray(signal(step), dtype=dtype), shape)
            spectrum.record(value, value)
    return forecasts


def test_twenty_step_schedule_matches_spec_test_vector():
    spectrum = Spectrum(20)
    drive(spectrum, lambda step: 0.0)
    assert spectrum.computed_steps == [1, 2, 3, 4, 6, 8, 11, 14, 18, 19, 20]
    assert spectrum.skipped_steps == [5, 7, 9, 10, 12, 13, 15, 16, 17]


@pytest.mark.parametrize("steps, computed", [(10, 7), (25, 13), (30, 14), (40, 16), (50, 19)])
def test_computed_step_counts_match_spec(steps, computed):
    spectrum = Spectrum(steps)
    drive(spectrum, lambda step: 0.0)
    assert len(spectrum.computed_steps) == computed
    assert sorted(spectrum.computed_steps + spectrum.skipped_steps) == list(range(1, steps + 1))


def test_stop_step_uses_float32_product():
    # float32(0.9) * 20 rounds to exactly 18.0 in float32; in float64 the same product is 17.9999995.
    assert Spectrum(20).schedule.stop_step == 18


def test_step_five_weights_match_spec_test_vector():
    spectrum = Spectrum(20)
    for step in range(1, 5):
        assert not spectrum.should_skip()
        spectrum.record(np.zeros(2, np.float32), np.zeros(2, np.float32))
    assert spectrum.should_skip()
    np.testing.assert_allclose(spectrum.chebyshev_weights(), [0.0064, 0.1337, 0.2472, 0.3474], atol=1e-4)
    np.testing.assert_allclose(spectrum.forecast_coefficients(), [0.0026, 0.0535, -0.2011, 1.039], atol=1e-4)


@pytest.mark.parametrize("m, lam, tau_axis", [(3, 1.0, "fixed50"), (2, 0.1, "steps"), (4, 0.0, "steps")])
def test_chebyshev_weights_match_numpy_chebvander_ridge(m, lam, tau_axis):
    spectrum = Spectrum(30, m=m, lam=lam, tau_axis=tau_axis, warmup=6)
    for _ in range(6):
        spectrum.record(np.zeros(1, np.float32), np.zeros(1, np.float32))
    counts = np.arange(6)
    scale = 50 if tau_axis == "fixed50" else 29
    design = np.polynomial.chebyshev.chebvander(counts / scale * 2 - 1, m)
    target = np.polynomial.chebyshev.chebvander(np.array([6 / scale * 2 - 1]), m)[0]
    expected = design @ np.linalg.solve(design.T @ design + lam * np.eye(m + 1), target)
    # lam=0, m=4 on six close points is ill-conditioned (cond ~1e10): 1e-6 is the attainable agreement.
    np.testing.assert_allclose(spectrum.chebyshev_weights(), expected, rtol=1e-5)


def test_cholesky_failure_adds_sd_cpp_jitter():
    # lam=0 with two history entries and four Chebyshev terms: X^T X is singular.
    spectrum = Spectrum(20, lam=0.0, warmup=2)
    spectrum.record(np.zeros(1, np.float32), np.zeros(1, np.float32))
    spectrum.record(np.zeros(1, np.float32), np.zeros(1, np.float32))
    assert spectrum.should_skip()
    design = np.polynomial.chebyshev.chebvander(np.array([-1.0, -0.96]), 3)
    target = np.polynomial.chebyshev.chebvander(np.array([-0.92]), 3)[0]
    gram = design.T @ design
    gram += 1e-4 * np.trace(gram) / 4 * np.eye(4)
    np.testing.assert_allclose(spectrum.chebyshev_weights(), design @ np.linalg.solve(gram, target), rtol=1e-8)


def test_faithful_default_forecasts_a_constant_too_small():
    # Spec: with lam=1 the Chebyshev weights sum to 0.73-0.85, so a constant comes out 6-11% too small.
    forecasts = drive(Spectrum(20), lambda step: 1.0)
    ratios = np.array([f[0] for f in forecasts.values()])
    # Measured 0.894-0.941.
    assert np.all((ratios > 0.88) & (ratios < 0.95)), ratios


def test_plus_options_forecast_a_linear_signal_exactly():
    def signal(step):
        return 0.3 + 0.05 * step

    # Fractional Taylor alone is exact on a line, whatever the gap since the last computed step.
    forecasts = drive(Spectrum(20, w=0.0, taylor="fractional"), signal)
    assert max(abs(f[0] - signal(s)) for s, f in forecasts.items()) < 1e-6
    # Least squares (lam=0) reproduces any polynomial of degree <= m, and so does the blend.
    forecasts = drive(Spectrum(20, lam=0.0, normalize=True, tau_axis="steps", taylor="fractional"), signal)
    assert max(abs(f[0] - signal(s)) for s, f in forecasts.items()) < 1e-5
    # The faithful default is biased on the same line; measured worst error 0.205 (on values 0.35-1.3).
    forecasts = drive(Spectrum(20), signal)
    assert 0.18 < max(abs(f[0] - signal(s)) for s, f in forecasts.items()) < 0.23


def test_cubic_is_reproduced_by_an_unregularised_chebyshev_fit():
    def signal(step):
        return 1.0 - 0.02 * step + 0.004 * step**2 - 0.0002 * step**3

    forecasts = drive(Spectrum(20, w=1.0, lam=0.0, tau_axis="steps"), signal, dtype=np.float64)
    assert max(abs(f[0] - signal(s)) for s, f in forecasts.items()) < 1e-5


def test_plus_options_beat_faithful_on_a_smooth_signal():
    def signal(step):
        return np.cos(step / 20 * 2.5)

    def worst(spectrum):
        return max(abs(f[0] - signal(s)) for s, f in drive(spectrum, signal).items())

    faithful = worst(Spectrum(20))
    plus = worst(Spectrum(20, normalize=True, tau_axis="steps", taylor="fractional"))
    # Measured worst forecast error: faithful 0.304, plus 0.129.
    assert plus < 0.15 and faithful > 0.25


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_forecast_keeps_shape_and_dtype(dtype):
    spectrum = Spectrum(20)
    rng = np.random.default_rng(0)
    forecasts = drive(spectrum, lambda step: rng.standard_normal((2, 3, 4)), shape=(2, 3, 4), dtype=dtype)
    for forecast in forecasts.values():
        assert forecast.shape == (2, 3, 4) and forecast.dtype == dtype


def test_reset_gives_a_fresh_schedule_and_identical_forecasts():
    spectrum = Spectrum(20)
    first = drive(spectrum, lambda step: np.sin(step))
    spectrum.reset()
    assert spectrum.computed_steps == [] and spectrum.skipped_steps == []
    second = drive(spectrum, lambda step: np.sin(step))
    assert first.keys() == second.keys()
    assert all(np.array_equal(first[s], second[s]) for s in first)


def test_withdraw_forecast_turns_the_step_into_a_computed_one():
    spectrum = Spectrum(20)
    for _ in range(4):
        spectrum.record(np.zeros(1, np.float32), np.zeros(1, np.float32))
    spectrum.forecast(np.zeros(1, np.float32))
    spectrum.withdraw_forecast()
    spectrum.record(np.zeros(1, np.float32), np.zeros(1, np.float32))
    assert spectrum.computed_steps == [1, 2, 3, 4, 5] and spectrum.skipped_steps == []
    with pytest.raises(RuntimeError):
        spectrum.withdraw_forecast()


@pytest.mark.parametrize("options", [
    {"m": -1}, {"m": 1.5}, {"w": 1.5}, {"w": -0.1}, {"window": 0}, {"lam": -1.0}, {"flex": -0.5},
    {"warmup": -1}, {"stop": 1.2}, {"tau_axis": "sigma"}, {"taylor": "second"}, {"normalize": "yes"},
])
def test_nonsense_parameters_are_rejected(options):
    with pytest.raises(AnimaError):
        Spectrum(20, **options)


def test_zero_steps_rejected():
    with pytest.raises(AnimaError):
        Spectrum(0)
