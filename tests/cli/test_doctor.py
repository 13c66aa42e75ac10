"""`anima-rknn doctor` on board trees laid out here (RK3588-like, without an NPU, with a low DDR clock, hostile
files) through the hidden --root, and on this machine itself, which has no NPU. The set checks use the tiny set
converted by the real rknn-toolkit2 (in .venv-rknn)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from anima_rknn.engine.memory_plan import plan_memory
from anima_rknn.export.manifest import read_manifest

HAS_TOOLKIT = importlib.util.find_spec("rknn") is not None
needs_toolkit = pytest.mark.skipif(not HAS_TOOLKIT, reason="rknn-toolkit2 lives in .venv-rknn")
GIB = 1 << 30


def write(root: Path, relative: str, content: str | bytes) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)


def devfreq(root: Path, node: str, governor: str, current: int, frequencies: list[int]) -> None:
    for name, value in (("governor", governor), ("cur_freq", current), ("max_freq", max(frequencies)),
                        ("min_freq", min(frequencies)),
                        ("available_frequencies", " ".join(map(str, frequencies)))):
        write(root, f"sys/class/devfreq/{node}/{name}", f"{value}\n")


def rock_5c(root: Path, *, runtime: str = "2.5.0", ddr: tuple[str, int] = ("dmc_ondemand", 2112000000),
            available_kb: int = 7_000_000) -> Path:
    """A Radxa ROCK 5C 8 GB as its files show it: RK3588S, librknnrt, rknpu 0.9.8, NPU and DDR devfreq, 4 little
    Cortex-A55 and 4 big Cortex-A76 cores, zram swap."""
    write(root, "proc/device-tree/compatible", b"radxa,rock-5c\0rockchip,rk3588s\0")
    write(root, "usr/lib/librknnrt.so", b"\x7fELF" + b"\0" * 64
          + f"librknnrt version: {runtime} (0123abcd@2025-01-01T00:00:00)".encode() + b"\0" * 64)
    write(root, "sys/kernel/debug/rknpu/version", "RKNPU driver: v0.9.8\n")
    devfreq(root, "fdab0000.npu", "rknpu_ondemand", 1000000000, [300000000, 600000000, 1000000000])
    devfreq(root, "dmc", ddr[0], ddr[1], [528000000, 1068000000, 1560000000, 2112000000])
    write(root, "proc/meminfo", f"MemTotal:        7919132 kB\nMemFree:         6000000 kB\n"
          f"MemAvailable:    {available_kb} kB\nSwapTotal:       3959564 kB\nSwapFree:        3959564 kB\n")
    write(root, "proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/dev/zram0 partition\t3959564\t0\t100\n")
    cpuinfo = []
    for cpu in range(8):
        big = cpu >= 4
        write(root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq", "2256000\n" if big else "1800000\n")
        write(root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "schedutil\n")
        cpuinfo.append(f"processor\t: {cpu}\nCPU part\t: {'0xd0b' if big else '0xd05'}\n")
    write(root, "proc/cpuinfo", "\n".join(cpuinfo))
    return root


def lines(text: str) -> dict[str, str]:
    """The report's lines by check name."""
    return {line.split()[1]: line for line in text.splitlines() if line[:5].strip() in ("ok", "WARN", "FAIL")}


def test_a_ready_board_passes_every_check(run_cli, tmp_path):
    result = run_cli("doctor", "--root", rock_5c(tmp_path))
    assert result.code == 0, result.err
    found = lines(result.out)
    assert list(found) == ["npu", "runtime", "driver", "npu-freq", "ddr-freq", "memory", "swap", "cores"]
    assert all(line.startswith("ok ") for line in found.values()), result.out
    assert "rk3588, NPU at /sys/class/devfreq/fdab0000.npu" in found["npu"]
    assert "librknnrt 2.5.0 (/usr/lib/librknnrt.so)" in found["runtime"]
    assert "RKNPU driver 0.9.8" in found["driver"] and "governor dmc_ondemand, 2112 MHz now" in found["ddr-freq"]
    assert "4 big (Cortex-A76, up to 2.26 GHz: cpu4-7), 4 little (Cortex-A55, up to 1.80 GHz: cpu0-3)" in found["cores"]
    assert "3.78 GiB (/dev/zram0), 3.78 GiB free" in found["swap"] and "7.55 GiB total" in found["memory"]
    assert result.out.splitlines()[-1] == "doctor: nothing blocking, 0 warning(s)"


def test_a_fixed_low_ddr_clock_is_flagged_with_its_fix(run_cli, tmp_path):
    result = run_cli("doctor", "--root", rock_5c(tmp_path, ddr=("userspace", 528000000)))
    assert result.code == 0  # slow, not blocking
    line = lines(result.out)["ddr-freq"]
    assert line.startswith("WARN") and "governor userspace, 528 MHz now, top 2112 MHz: fixed at 25%" in line
    assert ("fix: echo performance | sudo tee /sys/class/devfreq/dmc/governor   "
            "(or: echo 2112000000 | sudo tee /sys/class/devfreq/dmc/min_freq)") in line
    assert result.out.splitlines()[-1] == "doctor: nothing blocking, 1 warning(s)"


def test_big_cores_held_low_are_flagged(run_cli, tmp_path):
    root = rock_5c(tmp_path)
    write(root, "sys/devices/system/cpu/cpu6/cpufreq/scaling_governor", "powersave\n")
    line = lines(run_cli("doctor", "--root", root).out)["cores"]
    assert line.startswith("WARN") and "big cores [6] held by a fixed governor" in line
    assert "fix: echo performance | sudo tee /sys/devices/system/cpu/cpu6/cpufreq/scaling_governor" in line


def test_a_board_without_ddr_scaling_or_its_driver_version_is_warned(run_cli, tmp_path):
    root = rock_5c(tmp_path)
    for node in ("sys/class/devfreq/dmc", "sys/kernel/debug/rknpu"):
        for child in (root / node).iterdir():
            child.unlink()
    write(root, "sys/module/rknpu/version", "0.9.2\n")
    found = lines(run_cli("doctor", "--root", root).out)
    assert found["ddr-freq"].startswith("WARN") and "no DDR frequency scaling readable" in found["ddr-freq"]
    assert found["driver"].startswith("WARN") and "RKNPU driver 0.9.2 (/sys/module/rknpu/version), older" in (
        found["driver"])


def test_a_machine_without_an_npu_gets_a_report_and_exit_1(run_cli, tmp_path):
    write(tmp_path, "proc/meminfo", "MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\nSwapTotal: 0 kB\n")
    result = run_cli("doctor", "--root", tmp_path, "--json")
    assert result.code == 1 and "Traceback" not in result.err
    report = json.loads(result.out)
    assert report["blocking"] == ["npu", "runtime"] and report["root"] == str(tmp_path)
    assert result.err.splitlines()[-1] == "error: 2 blocking problem(s): npu, runtime"
    assert "FAIL npu      no Rockchip device tree" in result.err


def test_this_machine_is_checked_too(run_cli):
    """Here (x86, no NPU) and on the board alike: a report, never a traceback; the Python runtime is this one's."""
    result = run_cli("doctor", "--json")
    report = json.loads(result.out)
    names = [check["name"] for check in report["checks"]]
    assert names[:3] == ["npu", "runtime", "python"] and result.code == (1 if report["blocking"] else 0)
    assert "Traceback" not in result.err


@pytest.mark.parametrize("relative, content", [
    ("sys/class/devfreq/dmc/cur_freq", "fast\n"),
    ("sys/class/devfreq/dmc/governor", b"\xff\xfe\0\0garbage" * 10),
    ("sys/class/devfreq/dmc/available_frequencies", "9" * 400),
    ("proc/meminfo", "MemTotal: 99999999999999999999999 kB\n" * 5000),
    ("proc/cpuinfo", "processor : x\nCPU part : \n" * 3),
    ("sys/kernel/debug/rknpu/version", b"\0" * 70000),
])
def test_hostile_board_files_are_findings_not_tracebacks(run_cli, tmp_path, relative, content):
    root = rock_5c(tmp_path)
    write(root, relative, content)
    result = run_cli("doctor", "--root", root)
    assert result.code == 0 and "Traceback" not in result.err
    assert len(lines(result.out)) == 8


def test_a_directory_where_a_file_belongs_is_a_finding(run_cli, tmp_path):
    root = rock_5c(tmp_path)
    (root / "proc/meminfo").unlink()
    (root / "proc/meminfo").mkdir()
    found = lines(run_cli("doctor", "--root", root).out)
    assert found["memory"].startswith("WARN") and "cannot read /proc/meminfo" in found["memory"]


def test_model_without_a_set_is_refused(run_cli, tmp_path):
    result = run_cli("doctor", "--root", rock_5c(tmp_path), "--model", tmp_path)
    assert (result.code, result.err) == (1, "error: --model checks a set: pass --subgraphs DIR too\n")


@needs_toolkit
def test_a_converted_set_is_compared_with_the_runtime_and_planned(run_cli, tmp_path, tiny_rknn_set, model_dir):
    result = run_cli("doctor", "--root", rock_5c(tmp_path), "--subgraphs", tiny_rknn_set, "--model", model_dir)
    assert result.code == 0, result.out + result.err
    found = lines(result.out)
    toolkit = read_manifest(tiny_rknn_set)["rknn"]["toolkit_version"]
    assert f"not older than rknn-toolkit2 {toolkit} that converted the set" in found["runtime"]
    assert found["plan"].startswith("ok") and "6 of 6 contexts resident in the 6.68 GiB available, 0 loads" in (
        found["plan"]) and "generate with --rknn-budget 6835MiB" in found["plan"]
    assert found["model"].startswith("ok")


@needs_toolkit
def test_an_old_runtime_or_a_tight_budget_is_told(run_cli, tmp_path, tiny_rknn_set):
    old = run_cli("doctor", "--root", rock_5c(tmp_path / "old", runtime="1.6.0"), "--subgraphs", tiny_rknn_set)
    assert old.code == 1
    assert "FAIL runtime  librknnrt 1.6.0 (/usr/lib/librknnrt.so) is older than rknn-toolkit2" in old.out
    plan = plan_memory(read_manifest(tiny_rknn_set), None)
    totals = sorted(c.total_bytes for c in plan.contexts)
    tight = plan.host_bytes + totals[-1] + totals[-2]  # room for two contexts: one pinned, the rest take turns
    result = run_cli("doctor", "--root", rock_5c(tmp_path / "tight"), "--subgraphs", tiny_rknn_set,
                     "--budget", str(tight))
    assert result.code == 0 and lines(result.out)["plan"].startswith("WARN")
    assert "loads per pass" in lines(result.out)["plan"] and "contexts reload every pass" in result.out
    too_small = run_cli("doctor", "--root", rock_5c(tmp_path / "small"), "--subgraphs", tiny_rknn_set,
                        "--budget", "1MB")
    assert too_small.code == 1 and lines(too_small.out)["plan"].startswith("FAIL")
