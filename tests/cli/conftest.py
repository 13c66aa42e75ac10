from __future__ import annotations

import dataclasses
import sys

import pytest

from anima_rknn.cli import main


@dataclasses.dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run `anima-rknn ARGS` in this process through the real entry point (error handling included)."""

    def run(*args: str) -> Run:
        monkeypatch.setattr(sys, "argv", ["anima-rknn", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture
def model_dir(tiny_set):
    return tiny_set.dit.parents[2]
