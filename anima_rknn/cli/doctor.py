"""`anima-rknn doctor`: is this board ready for the rknn backend, and does a given set fit it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from ..core.files import json_text
from ..engine.doctor import Board, Check, report, run_checks
from ..engine.memory_plan import parse_size
from ..errors import AnimaError
from ..export.manifest import check_set, read_manifest
from ..model.model_set import resolve
from .group import cli
from .options import Respelled


@cli.command("doctor")
@click.option("--subgraphs", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="A converted subgraph set: compare librknnrt with its converter and plan its memory here.")
@click.option("--model", default=None, help="With --subgraphs: check that the set was made from this model's DiT.")
@click.option("--rknn-budget", "--budget", "budget", cls=Respelled, old=("--budget",), default=None, help="Plan the set under this much memory, e.g. 6GiB (default: the memory "
              "available now).")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as one JSON object on stdout.")
@click.option("--root", type=click.Path(file_okay=False, exists=True, path_type=Path), default=Path("/"),
              hidden=True, help="Read the board's files under this folder (a mounted image, the tests' trees).")
def doctor(subgraphs: Path | None, model: str | None, budget: str | None, as_json: bool, root: Path) -> None:
    """One line per check of what the board needs: the NPU, librknnrt against the set's converter, the NPU driver,
    the NPU and DDR clocks, memory and swap, the CPU cores and (with --subgraphs) whether the set fits. Exits with
    status 1 when a check is blocking (FAIL); WARN lines say what runs slower than it should, and the fix."""
    if model is not None and subgraphs is None:
        raise AnimaError("--model checks a set: pass --subgraphs DIR too")
    budget_bytes = None if budget is None else parse_size(budget)
    manifest = None if subgraphs is None else read_manifest(subgraphs)
    # The Python runtime is this process's: checked on the machine itself, not for a tree read elsewhere.
    here = root.resolve() == Path("/")
    checks = run_checks(Board(root), manifest, budget_bytes,
                        importlib.util.find_spec("rknnlite") is not None if here else None)
    if model is not None:
        try:
            check_set(manifest, subgraphs, dit_path=resolve(model).dit, width=manifest["width"],
                      height=manifest["height"])
            checks.append(Check("model", "ok", f"the set was made from {resolve(model).dit.name}"))
        except AnimaError as e:
            checks.append(Check("model", "fail", str(e), "export and convert a set from this model"))
    result = report(checks, root)
    if as_json:
        click.echo(json_text(result))
    echo = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    for check in checks:
        echo(check.line())
    if result["blocking"]:
        raise AnimaError(f"{len(result['blocking'])} blocking problem(s): {', '.join(result['blocking'])}")
    echo(f"doctor: nothing blocking, {len(result['warnings'])} warning(s)")
