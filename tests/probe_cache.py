"""A dtype-probe cache file written as the probe writes it, so a test can say what this machine measured."""

import json

from anima_rknn.core import cpu_speed


def write_cache(speeds: dict[str, float]) -> None:
    path = cpu_speed.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": "anima-rknn-dtype-probe/1", "machine": cpu_speed.machine_key(),
                                "gflops": speeds}))
