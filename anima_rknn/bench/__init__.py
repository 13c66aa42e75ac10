"""`anima-rknn bench`: the cached run against the uncached baseline, same weights, same seed, same noise.

run.py runs both sides, metrics.py measures them, report.py writes report.json / report.md with the verdict,
figures.py draws the comparison and per-step plots. The metrics and figures need the optional `bench` extra
(scikit-image, matplotlib), so this package imports none of its modules itself.
"""

# Lowest PSNR (dB) of a cached image against the baseline that the verdict accepts. 30 dB is an RMS error of
# 8/255, the usual "high quality" bar in image coding. Measured (benchmarks/bench_figures.py, random mid and tiny
# sets, 20 steps): the faithful defaults (11/20 computed) give 38.9 dB, reuse 42.5, spectrum-plus 48.4, so they
# pass with a 9 dB margin; schedules that skip more fall to 37.4 (10/20), 32.8 (8/20), 31.1 (6/20) and 24.0 dB
# (3/20), the last failing. Random-weight images are a weak proxy for real ones: look at the side-by-side too.
DEFAULT_MIN_PSNR = 30.0
