"""The auto thread count from crafted sysfs trees (laid out as /sys/devices/system/cpu), and torch and ONNX
Runtime set together."""

from pathlib import Path

import pytest
import torch

from anima_rknn.core import threads
from anima_rknn.core.threads import (
    auto_threads,
    idle_cores,
    machine_threads,
    parse_cpu_list,
    resolve_threads,
    session_options,
    use_threads,
)


def _cpu(root: Path, cpu: int, *, max_freq: int | None = None, siblings: str | None = None,
         package: int | None = None, core: int | None = None, capacity: int | None = None) -> None:
    folder = root / f"cpu{cpu}"
    files = {"cpufreq/cpuinfo_max_freq": max_freq, "topology/thread_siblings_list": siblings,
             "topology/physical_package_id": package, "topology/core_id": core, "cpu_capacity": capacity}
    for name, value in files.items():
        if value is not None:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(f"{value}\n")


def rk3588(root: Path, *, cpufreq: bool = True) -> Path:
    """4x Cortex-A55 at 1.8 GHz (cpu0-3, capacity 414) and 4x A76 at 2.4 GHz (cpu4-7 in two clusters, capacity
    1024): the RK3588's layout. Its core ids restart in each cluster, so they name no core alone."""
    for cpu in range(8):
        big = cpu >= 4
        _cpu(root, cpu, max_freq=(2_400_000 if big else 1_800_000) if cpufreq else None, siblings=str(cpu),
             package=0, core=cpu % 2 if big else cpu, capacity=1024 if big else 414)
    return root


def test_a_big_little_cpu_runs_on_its_big_cores(tmp_path):
    root = rk3588(tmp_path)
    assert auto_threads(root, allowed=range(8)) == 4
    assert auto_threads(root, allowed={0, 1, 2, 3, 5}) == 1  # the one big core this process may use
    assert auto_threads(root, allowed={0, 1, 2}) == 3  # little cores alone: all of them


def test_without_cpufreq_the_scheduler_capacity_tells_big_from_little(tmp_path):
    assert auto_threads(rk3588(tmp_path, cpufreq=False), allowed=range(8)) == 4


def test_smt_threads_of_one_core_count_once(tmp_path):
    for cpu in range(8):  # 4 cores x 2 threads, siblings numbered as Linux does on x86: cpu n and n + 4
        _cpu(tmp_path, cpu, max_freq=3_000_000, siblings=f"{cpu % 4},{cpu % 4 + 4}")
    assert auto_threads(tmp_path, allowed=range(8)) == 4
    assert auto_threads(tmp_path, allowed={0, 4, 1}) == 2


def test_package_and_core_ids_name_a_core_when_siblings_are_missing(tmp_path):
    for cpu in range(8):  # 2 packages x 2 cores x 2 threads
        _cpu(tmp_path, cpu, package=cpu // 4, core=cpu % 2)
    assert auto_threads(tmp_path, allowed=range(8)) == 4


def test_no_sysfs_counts_the_allowed_cpus(tmp_path):
    assert auto_threads(tmp_path / "missing", allowed={0, 3, 5}) == 3
    assert auto_threads(tmp_path, allowed=set()) == 1
    _cpu(tmp_path, 0, max_freq=2_000_000, siblings="0")  # one CPU's speed known, the other's not: both count
    _cpu(tmp_path, 1, siblings="1")
    assert auto_threads(tmp_path, allowed={0, 1}) == 2


def test_this_machine_gets_at_most_its_allowed_cpus():
    assert 1 <= auto_threads() <= len(threads.os.sched_getaffinity(0))


def test_cpu_lists_parse_as_sysfs_writes_them():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}


def test_resolve_keeps_a_count_and_turns_auto_into_this_machines(monkeypatch):
    assert resolve_threads(3) == 3 and resolve_threads(None) is None  # None: as torch is set when a run starts
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # an idle machine: every core
    for omp, auto in (("", auto_threads()), ("3", 3), ("0", auto_threads()), ("many", auto_threads())):
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
        assert resolve_threads(0) == auto, omp


@pytest.mark.parametrize("cores, load, expected", [
    (4, 0.0, 4), (4, 0.4, 4), (4, 1.6, 2), (4, 3.9, 1), (4, 12.0, 1), (2, 2.0, 1), (2, 0.6, 1), (8, 2.0, 6),
])
def test_auto_takes_the_cores_the_machines_other_work_leaves_idle(cores, load, expected):
    """On a machine whose other work uses every core, one thread (several times faster than two there:
    docs/measurements/reliability.md); on an idle one, every core."""
    assert idle_cores(cores, load) == expected


def test_auto_follows_the_load_when_a_run_starts(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_cores", lambda: 4)
    for load, expected in ((0.0, 4), (8.0, 1)):
        monkeypatch.setattr(threads.os, "getloadavg", lambda load=load: (load, load, load))
        assert resolve_threads(0) == expected


def test_the_machines_count_for_a_batch_job_id_ignores_the_load(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_cores", lambda: 4)
    for load in (0.0, 8.0):
        monkeypatch.setattr(threads.os, "getloadavg", lambda load=load: (load, load, load))
        assert machine_threads() == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert machine_threads() == 3


def test_openmp_waits_passively_unless_the_program_said_otherwise():
    import subprocess
    import sys

    code = "import os, anima_rknn; print(os.environ['OMP_WAIT_POLICY'])"
    env = {key: value for key, value in threads.os.environ.items() if key != "OMP_WAIT_POLICY"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout == "PASSIVE\n"
    assert subprocess.run([sys.executable, "-c", code], env=env | {"OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True,
                          text=True).stdout == "ACTIVE\n"


def test_torch_and_onnx_runtime_get_the_same_threads_without_spinning(one_thread):
    onnxruntime = pytest.importorskip("onnxruntime")
    use_threads(2)
    assert torch.get_num_threads() == 2
    options = session_options(onnxruntime)
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    with pytest.raises(RuntimeError, match="does not have configuration"):  # ONNX Runtime's default: spinning
        session_options(onnxruntime, spinning=True).get_session_config_entry("session.intra_op.allow_spinning")
