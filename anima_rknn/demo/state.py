"""train-demo's work folder (out/.train): its training state as safetensors + JSON, never a pickle.

It holds config.json (the run's DemoConfig), one safetensors file per stage (model, EMA and optimizer tensors,
the losses, and the progress as JSON in the metadata) and latents.safetensors (the encoded latent pool).
Everything read back is validated against the models being trained before any of it is used; anything
else found there, such as the pickle checkpoints of older versions, is refused unread.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from ..checks import is_integer, is_number, shown
from ..core.files import Unreadable, is_temporary, json_text, read_small_json
from ..core.tensorfile import load_tensors, read_metadata, read_shapes, save_tensors
from ..errors import AnimaError

WORK_FOLDER = ".train"
CONFIG_FILE = "config.json"
VAE_STATE, DIT_STATE, LATENTS = "vae.safetensors", "dit.safetensors", "latents.safetensors"
# train-demo builds its model set here and moves it into --out whole at the end: a run stopped before (a full disk,
# a kill) leaves only the work folder. Rebuilt from the checkpoints by every run, never read.
SET_STAGING = "set"
# train-demo-lora's work folder: the same kinds of files (its one stage, and a latent pool per kind of picture).
LORA_STATE, CONCEPT_LATENTS = "lora.safetensors", "concept_latents.safetensors"
PROGRESS_KEY = "anima_rknn.demo.progress"
_PROGRESS_FIELDS = {"step", "elapsed", "done", "param_groups", "optimizer_numbers"}
_OPTIMIZER_NAME = re.compile(r"optimizer\.state\.(\d+)\.(\w+)")
_ADAM_STATE = {"exp_avg", "exp_avg_sq", "step"}  # both stages use Adam(W) without amsgrad
_WHAT = "training state"


@dataclasses.dataclass
class StageState:
    step: int = 0
    elapsed: float = 0.0  # seconds of training, across resumptions
    done: bool = False
    losses: list[float] = dataclasses.field(default_factory=list)


def _refuse(path: Path, problem: str) -> AnimaError:
    return AnimaError(f"{path} is not usable training state: {problem}; it is not loaded "
                      "(a new --out starts afresh)")


def _as_json(value: object) -> object:
    """What `value` reads back as from JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def read_json(path: Path, limit: int = 1 << 16) -> object:
    """A small JSON file train-demo wrote; anything larger or not JSON is refused."""
    try:
        return read_small_json(path, limit)
    except Unreadable as e:
        raise _refuse(path, str(e)) from None


def check_work_folder(work: Path, stages: tuple[str, ...] = (VAE_STATE, DIT_STATE), pools: tuple[str, ...] = (LATENTS,),
                      command: str = "train-demo", staging: str | None = SET_STAGING) -> None:
    """Every file in `work` is one `command` writes (its config, `stages`, latent `pools`, the `staging` folder),
    and each state file reads as its format.

    Runs before anything is written, so that a bad file stops the run before minutes of work."""
    known = (CONFIG_FILE, *stages, *pools)
    if work.is_symlink() or (work.exists() and not work.is_dir()):
        raise AnimaError(f"{work} is not a folder {command} made; it is not used (use a new --out)")
    if not work.is_dir():
        return
    for entry in sorted(work.iterdir()):
        if is_temporary(entry) or entry.name == staging and entry.is_dir() and not entry.is_symlink():
            continue  # left by a killed run; never read
        if entry.name not in known or entry.is_symlink() or not entry.is_file():
            raise AnimaError(f"{entry} is not a file {command} writes (it keeps only {', '.join(known)} "
                             "there); it is not read (move it away, or use a new --out)")
    for name in stages:
        if (work / name).is_file():
            _read_progress(work / name)
    for name in pools:
        if (work / name).is_file():
            _latent_shape(work / name)


# ---- one stage: model(s) + optimizer + progress -----------------------------------------------------------


def _flat_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Per-parameter state as optimizer.state.<index>.<key> tensors, and what is not a tensor as JSON."""
    state = optimizer.state_dict()
    tensors, numbers = {}, {}
    for index, values in state["state"].items():
        for key, value in values.items():
            (tensors if isinstance(value, torch.Tensor) else numbers)[f"optimizer.state.{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "optimizer_numbers": numbers}


def save_stage(path: Path, state: StageState, modules: Mapping[str, torch.nn.Module],
               optimizer: torch.optim.Optimizer) -> None:
    tensors = {f"{prefix}.{name}": t for prefix, m in modules.items() for name, t in m.state_dict().items()}
    optimizer_tensors, optimizer_json = _flat_optimizer(optimizer)
    tensors.update(optimizer_tensors, losses=torch.tensor(state.losses, dtype=torch.float64))
    progress = {"step": state.step, "elapsed": state.elapsed, "done": state.done, **optimizer_json}
    save_tensors(tensors, path, {PROGRESS_KEY: json_text(progress)})


def _read_progress(path: Path) -> dict:
    """The progress record of a stage file, its fields checked (not yet against any model)."""
    text = read_metadata(path, _WHAT).get(PROGRESS_KEY)
    if text is None:
        raise _refuse(path, "no progress record")
    try:
        progress = json.loads(text)
    except (ValueError, RecursionError):
        raise _refuse(path, "its progress record is not valid JSON") from None
    if not isinstance(progress, dict) or set(progress) != _PROGRESS_FIELDS:
        raise _refuse(path, f"its progress record must be an object with exactly {sorted(_PROGRESS_FIELDS)}")
    step, elapsed = progress["step"], progress["elapsed"]
    if not (is_integer(step) and step >= 0):
        raise _refuse(path, f"step must be an integer >= 0, got {shown(step, 40)}")
    if not (is_number(elapsed) and elapsed >= 0):
        raise _refuse(path, f"elapsed must be a finite number >= 0, got {shown(elapsed, 40)}")
    if not isinstance(progress["done"], bool):
        raise _refuse(path, f"done must be true or false, got {shown(progress['done'], 40)}")
    if not isinstance(progress["param_groups"], list) or not isinstance(progress["optimizer_numbers"], dict):
        raise _refuse(path, "param_groups must be a list and optimizer_numbers an object")
    return progress


def _param_groups(path: Path, saved: list, optimizer: torch.optim.Optimizer) -> list[dict]:
    """This optimizer's own groups with the saved learning rates; every other setting must match."""
    fresh = optimizer.state_dict()["param_groups"]
    if len(saved) != len(fresh):
        raise _refuse(path, f"{len(saved)} optimizer parameter groups, expected {len(fresh)}")
    groups = []
    for mine, theirs in zip(fresh, saved):
        if not isinstance(theirs, dict) or set(theirs) != set(mine) or any(
                _as_json(mine[k]) != theirs[k] for k in mine if k != "lr"):
            raise _refuse(path, "its optimizer settings differ from this run's")
        if not (is_number(theirs["lr"]) and theirs["lr"] >= 0):
            raise _refuse(path, f"learning rate must be a finite number >= 0, got {shown(theirs['lr'], 40)}")
        groups.append({**mine, "lr": theirs["lr"]})
    return groups


def _fits(key: str, value: object, param: torch.Tensor) -> bool:
    """A step counter is a finite count (a scalar tensor or a number); the moments have the parameter's shape."""
    if key != "step":
        return isinstance(value, torch.Tensor) and value.shape == param.shape and value.dtype == param.dtype
    if isinstance(value, torch.Tensor):
        if value.shape != () or value.dtype != torch.float32:
            return False
        value = value.item()
    return is_number(value) and value >= 0


def _optimizer_state(path: Path, tensors: Mapping[str, torch.Tensor], numbers: dict,
                     optimizer: torch.optim.Optimizer) -> dict[int, dict]:
    """optimizer.state.<index>.<key> entries back into per-parameter state, each checked against its parameter."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict] = {}
    if twice := sorted(set(tensors) & set(numbers)):
        raise _refuse(path, f"{twice[0][:80]} is given twice, as a tensor and as a number")
    for name, value in {**tensors, **numbers}.items():
        match = _OPTIMIZER_NAME.fullmatch(name)
        if match is None or int(match[1]) >= len(params) or match[2] not in _ADAM_STATE:
            raise _refuse(path, f"unexpected entry {name[:80]}")
        param, key = params[int(match[1])], match[2]
        if not _fits(key, value, param):
            raise _refuse(path, f"{name} does not fit its parameter of shape {list(param.shape)}")
        # clone: the optimizer keeps these and updates them in place
        state.setdefault(int(match[1]), {})[key] = value.clone() if isinstance(value, torch.Tensor) else value
    for index, values in state.items():
        if set(values) != _ADAM_STATE:
            raise _refuse(path, f"optimizer state {index} has {sorted(values)}, expected {sorted(_ADAM_STATE)}")
    return state


def load_stage(path: Path, modules: Mapping[str, torch.nn.Module], optimizer: torch.optim.Optimizer) -> StageState:
    """Restore `modules` and `optimizer` exactly as they were saved; the file must fit them tensor for tensor."""
    progress = _read_progress(path)
    expected = {f"{prefix}.{name}": (tuple(t.shape), t.dtype)
                for prefix, m in modules.items() for name, t in m.state_dict().items()}
    expected["losses"] = ((progress["step"],), torch.float64)  # one loss per step
    shapes = read_shapes(path, _WHAT)  # checked before any tensor data is read
    for name, (shape, _) in expected.items():
        if name not in shapes:
            raise _refuse(path, f"tensor {name} is missing")
        if shapes[name] != shape:
            raise _refuse(path, f"tensor {name} has shape {list(shapes[name])}, expected {list(shape)}")
    tensors = load_tensors(path, _WHAT)
    for name, (_, dtype) in expected.items():
        if tensors[name].dtype != dtype:
            raise _refuse(path, f"tensor {name} is {tensors[name].dtype}, expected {dtype}")
    for name, tensor in tensors.items():  # training on from a NaN weight or moment only spreads it
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise _refuse(path, f"tensor {name} holds NaN or infinity")
    extra = {name: t for name, t in tensors.items() if name not in expected}
    optimizer_state = _optimizer_state(path, extra, progress["optimizer_numbers"], optimizer)
    groups = _param_groups(path, progress["param_groups"], optimizer)
    for prefix, module in modules.items():
        module.load_state_dict({name: tensors[f"{prefix}.{name}"] for name in module.state_dict()})
    optimizer.load_state_dict({"state": optimizer_state, "param_groups": groups})
    return StageState(progress["step"], float(progress["elapsed"]), progress["done"], tensors["losses"].tolist())


# ---- the latent pool --------------------------------------------------------------------------------------


def _latent_shape(path: Path) -> tuple[int, ...]:
    shapes = read_shapes(path, "latent pool")
    if set(shapes) != {"latents"}:
        raise _refuse(path, "a latent pool holds one tensor named latents")
    return shapes["latents"]


def load_latents(path: Path, shape: tuple[int, ...]) -> torch.Tensor:
    if (found := _latent_shape(path)) != shape:
        raise _refuse(path, f"the latent pool has shape {list(found)}, expected {list(shape)}")
    latents = load_tensors(path, "latent pool")["latents"]
    if latents.dtype != torch.float32:
        raise _refuse(path, f"the latent pool is {latents.dtype}, expected torch.float32")
    if not torch.isfinite(latents).all():
        raise _refuse(path, "the latent pool holds NaN or infinity")
    return latents


def save_latents(path: Path, latents: torch.Tensor) -> None:
    save_tensors({"latents": latents}, path)
