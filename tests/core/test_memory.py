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


def test_the_long_lived_objects_are_frozen_once_per_process():
    """The modules a process imported are frozen out of the collector's scans at its first call; later calls leave
    what came after to the collector (a fresh interpreter: this test process froze its own at collection)."""
    import subprocess
    import sys

    check = ("import gc; from anima_rknn.core.memory import freeze_long_lived; assert gc.get_freeze_count() == 0; "
             "freeze_long_lived(); frozen = gc.get_freeze_count(); assert frozen > 1000; later = [[] for _ in "
             "range(10)]; freeze_long_lived(); assert gc.get_freeze_count() == frozen; print(frozen)")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
