"""pyproject.toml's requirements as pip evaluates them on the board (aarch64 Linux) and on a PC (x86_64 Linux).

PyPI's aarch64 wheels of torch 2.11 and newer require CUDA 13 (cuda-toolkit, nvidia-*-cu13, triton: gigabytes on
a board without an NVIDIA GPU); those of 2.9.1 and 2.10.0 are CPU-only. So the board's torch is capped there,
while a PC keeps the whole range. scripts/board-check.sh installs for real in an emulated arm64 root; this is
its cheap, offline half.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
CPU_ONLY_ON_AARCH64 = ("2.4.0", "2.9.1", "2.10.0")
CUDA_ON_AARCH64 = ("2.10.1", "2.11.0", "2.13.0", "2.14.1", "3.0.0")


def requirements(machine: str, extra: str = "") -> dict[str, list[Requirement]]:
    """The requirements that apply on Linux / CPython 3.11 / `machine` with `extra` asked for, by name."""
    environment = {"platform_machine": machine, "sys_platform": "linux", "platform_system": "Linux",
                   "python_version": "3.11", "python_full_version": "3.11.2", "extra": extra}
    lines = PROJECT["dependencies"] + (PROJECT["optional-dependencies"][extra] if extra else [])
    applying: dict[str, list[Requirement]] = {}
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            applying.setdefault(requirement.name, []).append(requirement)
    return applying


def admits(requirements_of_one: list[Requirement], version: str) -> bool:
    return all(requirement.specifier.contains(version, prereleases=False) for requirement in requirements_of_one)


def test_the_board_gets_a_cpu_only_torch():
    torch = requirements("aarch64", "board")["torch"]
    assert all(admits(torch, version) for version in CPU_ONLY_ON_AARCH64)
    assert not any(admits(torch, version) for version in CUDA_ON_AARCH64)


def test_a_pc_keeps_the_whole_torch_range():
    torch = requirements("x86_64")["torch"]
    assert admits(torch, "2.13.0") and admits(torch, "2.14.1") and not admits(torch, "2.15.0")
    assert admits(torch, Version(metadata.version("torch")).base_version)  # the torch this suite runs on


def test_the_board_extra_brings_the_npu_runtime_and_onnx_runtime():
    board = requirements("aarch64", "board")
    assert admits(board["rknn-toolkit-lite2"], "2.5.0") and admits(board["onnxruntime"], "1.19.2")
    # rknn-toolkit-lite2 has aarch64 wheels only: on a PC the extra must not ask for it
    assert "rknn-toolkit-lite2" not in requirements("x86_64", "board")


@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
def test_each_machine_has_one_torch_requirement(machine):
    assert len(requirements(machine)["torch"]) == 1
