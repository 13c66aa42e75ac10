"""`doctor`: what an RK3588 board needs for the rknn backend, one check at a time, read from its files.

Everything is read from files under a root ("/" on the board; a laid-out tree in the tests, or a mounted image):
the device tree, librknnrt.so, the NPU driver's version, the NPU and DDR devfreq nodes, /proc/meminfo and
/proc/swaps, the CPU cores' cpufreq nodes and /proc/cpuinfo. A file that is missing, unreadable or holds nonsense
is a finding, never an exception. Each check is "ok", "warn" (runs, but slower or riskier than it should) or
"fail" (blocking: the rknn backend cannot run, or the set cannot run here).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import AnimaError
from .backends.rknn import LIBRKNNRT_PATHS, board_platform, librknnrt_version, version_tuple
from .memory_plan import plan_memory, size

STATUSES = ("ok", "warn", "fail")
NPU_DEVFREQ = "sys/class/devfreq/fdab0000.npu"
DDR_DEVFREQ = "sys/class/devfreq/dmc"
# Where the driver's version shows: debugfs (root only), the module's own version, the platform device's.
DRIVER_VERSION_FILES = ("sys/kernel/debug/rknpu/version", "sys/module/rknpu/version")
NPU_DEVICES = ("dev/rknpu", "sys/bus/platform/devices/fdab0000.npu", NPU_DEVFREQ)
# 0.9.6 is the first driver that lets the NPU allocate beyond 4 GB and the one Rockchip calls more stable than 0.9.2
# (airockchip/rknn-llm issue 97); older ones also ran slower (rknn-toolkit2 issue 468).
MIN_DRIVER = "0.9.6"
# Governors that hold a clock whatever the load: with one of them below the top frequency the clock is fixed low.
FIXED_GOVERNORS = ("powersave", "userspace")
CPU_PARTS = {"0xd03": "Cortex-A53", "0xd05": "Cortex-A55", "0xd0b": "Cortex-A76", "0xd08": "Cortex-A72"}
_VERSION = re.compile(r"(\d+\.\d+\.\d+)")
MAX_READ = 1 << 16  # sysfs and procfs files are small; anything bigger is not what it should be


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # one of STATUSES
    detail: str
    fix: str | None = None  # the command or step that fixes a warn / fail

    def line(self) -> str:
        mark = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}[self.status]
        return f"{mark:<5}{self.name:<9}{self.detail}" + (f"; fix: {self.fix}" if self.fix else "")


class Board:
    """The files of a board (or a tree laid out like one) under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, relative: str) -> Path:
        return self.root / relative.lstrip("/")

    def text(self, relative: str) -> str | None:
        """A small text file's content, stripped; None if it is missing, unreadable, binary or too big."""
        try:
            with open(self.path(relative), "rb") as f:
                data = f.read(MAX_READ + 1)
        except OSError:
            return None
        if len(data) > MAX_READ or b"\0" in data.rstrip(b"\0"):
            return None
        return data.rstrip(b"\0").decode("utf-8", errors="replace").strip()

    def number(self, relative: str) -> int | None:
        return natural(self.text(relative) or "")

    def exists(self, relative: str) -> bool:
        try:
            return self.path(relative).exists()
        except OSError:
            return False


def natural(text: str) -> int | None:
    """A count as sysfs writes one (decimal digits, below 10**18), else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None


def mhz(hz: int) -> str:
    return f"{hz / 1e6:.0f} MHz"


def platform_check(board: Board) -> Check:
    platform = board_platform(board.path("proc/device-tree/compatible"))
    npu = [name for name in NPU_DEVICES if board.exists(name)]
    if platform is None:
        return Check("npu", "fail", "no Rockchip device tree (/proc/device-tree/compatible): this machine has no "
                     "RK3588 NPU", "run the rknn backend on the board; here use --backend torch or onnx")
    if not npu:
        return Check("npu", "fail", f"{platform} board, but no NPU device ({', '.join('/' + n for n in NPU_DEVICES)})",
                     "use a board image whose kernel has the rknpu driver enabled")
    return Check("npu", "ok", f"{platform}, NPU at /{npu[0]}")


def runtime_check(board: Board, conversion: dict[str, Any] | None) -> Check:
    library = next((p for p in LIBRKNNRT_PATHS if board.path(str(p)).is_file()), None)
    if library is None:
        return Check("runtime", "fail", f"librknnrt.so not found ({', '.join(str(p.parent) for p in LIBRKNNRT_PATHS)})",
                     "install the RKNPU2 runtime of your board image (librknnrt.so, as new as the converter)")
    try:
        version = librknnrt_version(board.path(str(library)))
    except OSError as e:
        return Check("runtime", "fail", f"cannot read {library}: {e.strerror}")
    if version is None:
        return Check("runtime", "fail", f"{library} carries no version banner",
                     "install a librknnrt.so from Rockchip's RKNPU2 runtime")
    if conversion is None:
        return Check("runtime", "ok", f"librknnrt {version} ({library}); no converted set to compare it with "
                     "(--subgraphs)")
    wanted, target = conversion["toolkit_version"], conversion["target"]
    platform = board_platform(board.path("proc/device-tree/compatible"))
    if platform is not None and platform != target:
        return Check("runtime", "fail", f"the set was converted for {target}, this board is {platform}",
                     f"convert-rknn --target {platform}")
    if version_tuple(version) < version_tuple(wanted):
        return Check("runtime", "fail", f"librknnrt {version} ({library}) is older than rknn-toolkit2 {wanted} that "
                     "converted the set", f"install librknnrt {wanted} or newer")
    return Check("runtime", "ok", f"librknnrt {version} ({library}), not older than rknn-toolkit2 {wanted} that "
                 "converted the set")


def driver_check(board: Board) -> Check:
    for relative in DRIVER_VERSION_FILES:
        text = board.text(relative)
        match = _VERSION.search(text or "")
        if match:
            version = match.group(1)
            if version_tuple(version) < version_tuple(MIN_DRIVER):
                return Check("driver", "warn", f"RKNPU driver {version} (/{relative}), older than {MIN_DRIVER}: "
                             "slower, and no NPU allocation beyond 4 GB",
                             f"a board image or kernel with rknpu {MIN_DRIVER} or newer")
            return Check("driver", "ok", f"RKNPU driver {version} (/{relative})")
    looked = ", ".join("/" + f for f in DRIVER_VERSION_FILES)
    return Check("driver", "warn", f"cannot read the RKNPU driver version ({looked}; debugfs is readable by root only)",
                 "sudo anima-rknn doctor, or: sudo dmesg | grep -i rknpu")


def devfreq_check(board: Board, name: str, node: str, what: str) -> Check:
    """A devfreq node's governor and clocks: warn when it is missing, fixed below its top clock, or capped."""
    governor = board.text(f"{node}/governor")
    current = board.number(f"{node}/cur_freq")
    available = [n for f in (board.text(f"{node}/available_frequencies") or "").split() if (n := natural(f))]
    top = max(available, default=board.number(f"{node}/max_freq"))
    if governor is None or current is None or top is None:
        fix = f"use a board image with {what} frequency scaling (its devfreq node /{node})"
        return Check(name, "warn", f"no {what} frequency scaling readable at /{node}: its clock is whatever the "
                     "boot set", fix)
    cap = board.number(f"{node}/max_freq")
    state = f"governor {governor}, {mhz(current)} now, top {mhz(top)}"
    fix = (f"echo performance | sudo tee /{node}/governor   (or: echo {top} | sudo tee /{node}/min_freq)")
    if cap is not None and cap < top:
        return Check(name, "warn", f"{state}: capped at {mhz(cap)}", f"echo {top} | sudo tee /{node}/max_freq")
    if governor in FIXED_GOVERNORS and current < top:
        return Check(name, "warn", f"{state}: fixed at {current * 100 // top}% of its top clock", fix)
    return Check(name, "ok", state)


def memory_check(meminfo: dict[str, int]) -> Check:
    if "MemTotal" not in meminfo:
        return Check("memory", "warn", "cannot read /proc/meminfo")
    total, available = meminfo["MemTotal"], meminfo.get("MemAvailable", meminfo.get("MemFree", 0))
    return Check("memory", "ok", f"{size(total)} total, {size(available)} available")


def swap_check(board: Board, meminfo: dict[str, int]) -> Check:
    if "SwapTotal" not in meminfo:
        return Check("swap", "warn", "cannot read /proc/meminfo")
    devices = [line.split()[0] for line in (board.text("proc/swaps") or "").splitlines()[1:] if line.split()]
    where = f" ({', '.join(devices)})" if devices else ""
    if meminfo["SwapTotal"] == 0:
        return Check("swap", "ok", "none: a run that outgrows memory is killed rather than slowed (size it with "
                     "plan and --rknn-budget)")
    return Check("swap", "ok", f"{size(meminfo['SwapTotal'])}{where}, {size(meminfo.get('SwapFree', 0))} free")


def read_meminfo(board: Board) -> dict[str, int]:
    found = {}
    for line in (board.text("proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and (count := natural(parts[0])) is not None:
            found[key.strip()] = count * (1024 if parts[1:] == ["kB"] else 1)
    return found


def cores_check(board: Board) -> Check:
    """Big and little cores, told apart by their top clocks (and named by /proc/cpuinfo's CPU part where it has
    them); a big core's governor that holds it low is flagged."""
    cpus = sorted(int(p.name[3:]) for p in _listing(board.path("sys/devices/system/cpu"))
                  if re.fullmatch(r"cpu\d{1,4}", p.name))
    if not cpus:
        return Check("cores", "warn", "cannot list the CPU cores (/sys/devices/system/cpu)")
    parts = _cpu_parts(board.text("proc/cpuinfo") or "")
    clusters: dict[int, list[int]] = {}
    for cpu in cpus:
        clusters.setdefault(board.number(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq") or 0,
                            []).append(cpu)
    if len(clusters) < 2:
        return Check("cores", "ok", f"{len(cpus)} cores, no big.LITTLE clusters")
    described, slow = [], []
    for rank, (khz, members) in enumerate(sorted(clusters.items(), reverse=True)):
        label = "big" if rank == 0 else "little" if rank == len(clusters) - 1 else "mid"
        part = parts.get(members[0])
        described.append(f"{len(members)} {label} ({part + ', ' if part else ''}up to {khz / 1e6:.2f} GHz: "
                         f"cpu{members[0]}-{members[-1]})")
        if rank == 0:
            slow = [cpu for cpu in members if board.text(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")
                    in FIXED_GOVERNORS]
    detail = f"{len(cpus)} cores: " + ", ".join(described)
    if slow:
        return Check("cores", "warn", f"{detail}; big cores {slow} held by a fixed governor",
                     f"echo performance | sudo tee /sys/devices/system/cpu/cpu{slow[0]}/cpufreq/scaling_governor")
    return Check("cores", "ok", detail)


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _cpu_parts(cpuinfo: str) -> dict[int, str]:
    parts, processor = {}, None
    for line in cpuinfo.splitlines():
        key, _, value = (s.strip() for s in line.partition(":"))
        if key == "processor":
            processor = natural(value)
        elif key == "CPU part" and processor is not None:
            parts[processor] = CPU_PARTS.get(value.lower(), f"part {value}")
    return parts


def plan_check(manifest: dict[str, Any], budget_bytes: int, budget_source: str) -> Check:
    try:
        plan = plan_memory(manifest, budget_bytes)
    except AnimaError as e:
        return Check("plan", "fail", f"the set does not fit {budget_source}: {e}", "a smaller resolution or an "
                     "int8 set")
    detail = (f"{plan.max_resident} of {len(plan.contexts)} contexts resident in {budget_source}, "
              f"{plan.loads_per_pass} loads per pass, predicted peak {size(plan.peak_bytes)}")
    option = f"--rknn-budget {budget_bytes // (1 << 20)}MiB"
    if plan.loads_per_pass:
        return Check("plan", "warn", f"{detail}: contexts reload every pass", f"generate with {option} (without it "
                     "every context stays open and the run outgrows memory)")
    return Check("plan", "ok", f"{detail}; generate with {option}")


def run_checks(board: Board, manifest: dict[str, Any] | None = None, budget_bytes: int | None = None,
               python_runtime: bool | None = None) -> list[Check]:
    """Every check, in the order they print. `manifest`: a subgraph set's (the converter version and the plan);
    `budget_bytes`: the plan's budget (default: the board's available memory); `python_runtime`: whether
    rknn-toolkit-lite2 imports in this Python (None: not checked, the root is not this machine's)."""
    meminfo = read_meminfo(board)
    checks = [platform_check(board), runtime_check(board, manifest.get("rknn") if manifest else None)]
    if python_runtime is not None:
        checks.append(Check("python", "ok", "rknn-toolkit-lite2 imports") if python_runtime else
                      Check("python", "fail", "rknn-toolkit-lite2 is not installed in this Python",
                            "pip install rknn-toolkit-lite2 (in the venv that runs anima-rknn)"))
    checks += [driver_check(board), devfreq_check(board, "npu-freq", NPU_DEVFREQ, "NPU"),
               devfreq_check(board, "ddr-freq", DDR_DEVFREQ, "DDR"), memory_check(meminfo),
               swap_check(board, meminfo), cores_check(board)]
    if manifest is not None:
        if manifest.get("rknn") is None:
            checks.append(Check("set", "fail", "the set holds ONNX subgraphs, not .rknn ones",
                                "anima-rknn convert-rknn --subgraphs DIR --out DIR"))
        available = meminfo.get("MemAvailable")
        if budget_bytes is not None:
            checks.append(plan_check(manifest, budget_bytes, f"the budget of {size(budget_bytes)}"))
        elif available is not None:
            checks.append(plan_check(manifest, available, f"the {size(available)} available"))
        else:
            checks.append(Check("plan", "warn", "no memory figure to plan with", "pass --budget"))
    return checks


def report(checks: list[Check], root: Path) -> dict[str, Any]:
    return {"root": str(root), "checks": [asdict(c) for c in checks],
            "blocking": [c.name for c in checks if c.status == "fail"],
            "warnings": [c.name for c in checks if c.status == "warn"]}
