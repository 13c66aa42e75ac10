"""Measuring a block's peak memory, as the bench and the memory benchmark do."""

from pathlib import Path

import numpy as np
import pytest

from anima_rknn.core import memory


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_peak_rss_is_reset_per_block():
    size = 96 * 1024 * 1024
    with memory.peak_rss() as big:
        block = np.ones(size // 8)  # touched pages: really resident
        del block
    with memory.peak_rss() as small:
        pass
    if big.bytes is None:
        pytest.skip("this kernel does not let a process reset its RSS high-water mark")
    # The second block allocated nothing: had the mark not been reset, it would report the first one's peak.
    assert big.bytes - small.bytes > 0.8 * size
