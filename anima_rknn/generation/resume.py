"""Stop a long generation and resume it later, bit-identically: the resume state file and periodic checkpoints.

A state is one safetensors file (written through the output module, so always whole): the latent after the
last finished step, both prompts' DiT contexts, the cache's stored x0, the sampler's history (the x0 a multistep
sampler reads again; under auto's verify also the latent and history of the step the run would re-run from), and
one JSON record in its metadata with the format version, every generation setting,
fingerprints of the model files and the subgraph set, the step index and the cache's schedule. A stochastic
sampler's noise is not stored: it is drawn again from (seed, step). An init image and mask are not stored either,
only their sha256 among the settings: a resumed image-to-image run is given the same files again, refused when
they differ, and encodes them again (a hires state names the pass it stopped in). Nothing in it is a path we
open or a pickle:
resuming reads tensors and JSON only, and every value is checked before use.

Prompt contexts are stored rather than re-encoded: 4 MiB at Anima's 512 x 1024 x 2 in float32 against loading
1.2 GB of Qwen3 again (seconds on the board), and re-encoding with another thread count could change the
last bits, which would break the promise that a resumed image is identical.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checks import is_int_in, is_integer, is_number, shown
from ..core.files import json_text
from ..core.tensorfile import load_tensors, read_metadata, save_tensors
from ..errors import AnimaError
from ..sampling.caches import restore_cache
from ..sampling.sample import StepCallback, StepEvent
from ..sampling.samplers import SAMPLERS, call_sigmas, history_layout
from .params import LATER_SETTINGS, SETTINGS, DenoisePass, GenerationParams, settings_of
from .prompt_schedule import pass_cache, pass_starts
from .result import Conditioning

STATE_FORMAT = "anima-rknn-resume/1"
STATE_KEY = "anima_rknn.resume"  # the metadata key of every state written: a format name, not the module path
STATE_SUFFIX = ".state"
# Checkpoints by default: after every computed step, once the run is this long (elapsed + ETA), so that a
# crash or power cut on the board loses one step, while a seconds-long CPU run writes nothing.
LONG_RUN_S = 60.0
# "loras": in states written since LoRAs; "hires_subgraphs": in those of a hires run on onnx / rknn.
FINGERPRINTS = {"dit", "text_encoder", "vae", "subgraphs", "loras", "hires_subgraphs"}


class Interrupted(Exception):
    """The run stopped after a finished step because a stop was asked for; its state is at `path` (None when
    the stop came before the first step ended: then there is nothing to resume)."""

    def __init__(self, path: Path | None, step: int, total: int) -> None:
        super().__init__(f"stopped after step {step}/{total}")
        self.path, self.step, self.total = path, step, total


def default_state_path(out: Path) -> Path:
    return out.with_name(out.name + STATE_SUFFIX)


def output_of_state(state: Path) -> Path | None:
    """`x.png.state` was written for `x.png`; other names say nothing about their output."""
    if not state.name.endswith(".png" + STATE_SUFFIX):
        return None
    return state.with_name(state.name.removesuffix(STATE_SUFFIX))


@dataclasses.dataclass
class ResumeState:
    params: GenerationParams
    fingerprints: dict[str, str | None]  # dit, text_encoder, vae, subgraphs
    step: int  # steps finished
    latent: np.ndarray  # after `step` steps
    conditioning: Conditioning
    cache_state: dict[str, Any]
    sampler_state: dict[str, Any]  # the sampler's history and the refused forecasts so far (StepEvent's)
    denoise_s: float  # denoising time spent before the stop
    pass_index: int = 0  # the denoising pass it stopped in (1: the hires fix's second); `step` counts its steps

    def check_settings(self, params: GenerationParams) -> None:
        """Refuse, naming the first difference, a run asking for other settings than the state was made with."""
        for name in SETTINGS:
            ours, theirs = getattr(self.params, name), getattr(params, name)
            if ours != theirs:
                raise AnimaError(f"the state was made with {name} {shown(ours)}, this run asks for {shown(theirs)}")

    def check_model(self, fingerprints: dict[str, str | None], context_shape: tuple[int, ...]) -> None:
        """Refuse a state made with other model files or a subgraph set, or whose contexts this DiT cannot take."""
        for name in sorted(self.fingerprints.keys() | fingerprints.keys()):
            if self.fingerprints.get(name) != fingerprints.get(name):
                what = {"subgraphs": "subgraph set", "hires_subgraphs": "hires subgraph set",
                        "loras": "set of LoRA files"}.get(
                    name, name.replace("_", " ") + " file")
                raise AnimaError(f"the state was made with another {what}")
        if tuple(self.conditioning.positive.shape) != context_shape:
            raise AnimaError(f"the state's prompt contexts are {list(self.conditioning.positive.shape)}, this DiT "
                             f"takes {list(context_shape)}")


# ---- writing -------------------------------------------------------------------------------------------------

def _stored(prefix: str, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A state() dict as JSON entries, its lists of arrays moved into `tensors` as prefix.key.i."""
    scalars: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
            for i, array in enumerate(value):
                tensors[f"{prefix}.{key}.{i}"] = torch.from_numpy(np.ascontiguousarray(array))
            scalars[key] = {"arrays": len(value)}
        else:
            scalars[key] = {"value": value}
    return scalars


def write_state(path: Path, params: GenerationParams, fingerprints: dict[str, str | None], event: StepEvent,
                conditioning: Conditioning, denoise_s: float, pass_index: int = 0) -> None:
    tensors = {"latent": torch.from_numpy(np.ascontiguousarray(event.x)),
               "context.positive": conditioning.positive, "context.negative": conditioning.negative}
    sampler_state = event.sampler_state or {}
    record = {
        "format": STATE_FORMAT, "pass": pass_index, "step": event.step, "total": event.total,
        "recomputed": list(sampler_state.get("recomputed", [])), "denoise_s": denoise_s,
        "fingerprints": fingerprints, "params": settings_of(params),
        "cache": _stored("cache", event.cache_state, tensors),
        "sampler": _stored("sampler", sampler_state.get("history", {}), tensors),
    }
    trusted = sampler_state.get("trusted")
    if trusted is not None:  # auto's verify: what a flagged run re-runs from
        tensors["trusted.latent"] = torch.from_numpy(np.ascontiguousarray(trusted["latent"]))
        record["trusted"] = {"step": trusted["step"], "recomputed": list(trusted["recomputed"]),
                             "history": _stored("trusted.history", trusted["history"], tensors)}
    save_tensors(tensors, path, {STATE_KEY: json_text(record)})


class Checkpoints:
    """A step listener that writes the resume state: every `every` steps, or (every=None) after every computed
    step of a long run; and, when `stop()` turns true, once more before ending the run with Interrupted.

    A periodic checkpoint that cannot be written is passed to `warn` and the run goes on (a full disk should
    not cost the run it protects); the state written for a stop must succeed or the stop fails loudly."""

    def __init__(self, path: Path, every: int | None = None, stop: Callable[[], bool] = lambda: False,
                 warn: Callable[[AnimaError], None] | None = None) -> None:
        if every is not None and not (is_integer(every) and every >= 1):
            raise AnimaError(f"--checkpoint-every must be a positive number of steps, got {every!r}")
        self.path, self.every, self.stop, self.warn = Path(path), every, stop, warn

    def listener(self, params: GenerationParams, fingerprints: dict[str, str | None], conditioning: Conditioning,
                 on_step: StepCallback | None, resumed: ResumeState | None = None,
                 pass_index: int = 0) -> StepCallback:
        """The listener of denoising pass `pass_index`, whose own events it is given (their steps count that
        pass's); `on_step` gets them after the state is written."""
        spent_before = resumed.denoise_s if resumed else 0.0

        def write(event: StepEvent) -> None:
            write_state(self.path, params, fingerprints, event, conditioning, spent_before + event.elapsed_s,
                        pass_index)

        def listen(event: StepEvent) -> None:
            last = event.step == event.total
            due = (event.step % self.every == 0 if self.every is not None
                   else event.computed and spent_before + event.elapsed_s + event.eta_s > LONG_RUN_S)
            written = False
            if due and not last:  # first the state, then the listeners that could fail
                try:
                    write(event)
                    written = True
                except AnimaError as e:
                    if self.warn is None:
                        raise
                    self.warn(e)
            if on_step is not None:
                on_step(event)
            if self.stop() and not last:
                if not written:
                    write(event)
                raise Interrupted(self.path, event.step, event.total)

        return listen

    def stop_before_denoising(self, total: int) -> None:
        """A stop asked for while the models load or the prompt is encoded ends the run now, with nothing to resume."""
        if self.stop():
            raise Interrupted(None, 0, total)

    def remove(self) -> None:
        """The run finished and its output is written: its state has nothing left to resume."""
        self.path.unlink(missing_ok=True)


# ---- reading -------------------------------------------------------------------------------------------------

def _field(record: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = record.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise AnimaError(f"the resume state's {name} is missing or of the wrong type")
    return value


def read_state(path: str | os.PathLike) -> ResumeState:
    """A state written by write_state, every value checked; anything else is one AnimaError line."""
    path = Path(path)
    try:
        found = path.is_file()
    except OSError as e:  # a name too long (ENAMETOOLONG), a folder that cannot be searched: not a False
        raise AnimaError(f"resume state {shown(str(path), 80)}: cannot read it: {e.strerror or e}") from None
    if not found:
        raise AnimaError(f"resume state not found: {path}")
    try:
        record = json.loads(read_metadata(path, "resume state", dtypes=("F32",)).get(STATE_KEY, "null"))
    except (ValueError, RecursionError):
        raise AnimaError(f"{path}: the resume record is not valid JSON") from None
    if not isinstance(record, dict) or record.get("format") != STATE_FORMAT:
        found = record.get("format") if isinstance(record, dict) else None
        raise AnimaError(f"{path} is not an {STATE_FORMAT} resume state"
                         + (f" (it is {shown(found)}: made by another version)" if found else ""))
    settings = LATER_SETTINGS | _field(record, "params", dict)  # an earlier version's state names fewer
    if set(settings) != set(SETTINGS):
        raise AnimaError(f"{path}: the resume state's settings are not the ones this version writes")
    try:
        params = GenerationParams(**settings)
        params.validate()
    except (TypeError, AnimaError) as e:
        raise AnimaError(f"{path}: the resume state's settings are invalid ({e})") from None
    step, total = _field(record, "step", int), _field(record, "total", int)
    passes = params.passes()
    pass_index = record.get("pass", 0)  # a state written before the hires fix is of the one pass
    if not is_int_in(pass_index, 0, len(passes) - 1):
        raise AnimaError(f"{path}: the resume state's pass {shown(pass_index)} is not one its settings make")
    denoise_pass = passes[pass_index]
    if total != denoise_pass.steps_run or not 1 <= step < total:
        raise AnimaError(f"{path}: the resume state's step {step} of {total} does not fit its "
                         f"{denoise_pass.steps_run} steps")
    recomputed = _field(record, "recomputed", list)
    denoise_s = _field(record, "denoise_s", (int, float))
    fingerprints = _field(record, "fingerprints", dict)
    sigmas = denoise_pass.sigmas
    calls_done = params.model_calls(sigmas[: step + 1])
    if (not {"dit", "text_encoder", "vae", "subgraphs"} <= set(fingerprints) <= FINGERPRINTS
            or not all(v is None or isinstance(v, str) for v in fingerprints.values())
            or not all(is_int_in(s, 1, calls_done) for s in recomputed) or not is_number(denoise_s)):
        raise AnimaError(f"{path}: the resume state's record is damaged")
    tensors = {name: t.numpy() for name, t in load_tensors(path, "resume state", dtypes=("F32",)).items()}
    latent = tensors.pop("latent", None)
    expected = (1, 16, denoise_pass.height // 8, denoise_pass.width // 8)
    if latent is None or latent.shape != expected or not np.isfinite(latent).all():
        raise AnimaError(f"{path}: the resume state's latent is missing, not {list(expected)} or not finite")
    contexts = [tensors.pop(f"context.{side}", None) for side in ("positive", "negative")]
    if any(c is None or c.ndim != 3 or c.shape[0] != 1 or c.shape != contexts[0].shape or not np.isfinite(c).all()
           for c in contexts):
        raise AnimaError(f"{path}: the resume state's prompt contexts are missing or damaged")
    cache_state = _arrays_back("cache", _field(record, "cache", dict), tensors, path)
    # A state written before other samplers existed has no sampler entry: Euler's history is empty.
    history = _arrays_back("sampler", record.get("sampler", {}) if isinstance(record.get("sampler", {}), dict)
                           else None, tensors, path)
    sampler_state = {"history": history, "recomputed": recomputed}
    if "trusted" in record:
        sampler_state["trusted"] = _trusted_back(record["trusted"], tensors, params, sigmas, step, latent.shape, path)
    if tensors:
        raise AnimaError(f"{path}: the resume state's cache arrays do not match its record")
    _check_cache(params, denoise_pass, cache_state, step, calls_done, latent.size, path)
    _check_history(history, params, sigmas, step, latent.shape, path)
    conditioning = Conditioning(torch.from_numpy(contexts[0]), torch.from_numpy(contexts[1]), 0.0)
    return ResumeState(params, fingerprints, step, latent, conditioning, cache_state, sampler_state,
                       float(denoise_s), pass_index)


def _check_history(history: dict[str, Any], params: GenerationParams, sigmas: np.ndarray, step: int,
                   shape: tuple[int, ...], path: Path) -> None:
    layout = history_layout(SAMPLERS[params.sampler], sigmas, step)
    if {key: len(value) if isinstance(value, list) else None for key, value in history.items()} != layout or any(
            array.shape != shape for arrays in history.values() for array in arrays):
        raise AnimaError(f"{path}: the resume state's sampler history does not fit {params.sampler} at step {step}")


def _trusted_back(entry: Any, tensors: dict[str, np.ndarray], params: GenerationParams, sigmas: np.ndarray,
                  step: int, shape: tuple[int, ...], path: Path) -> dict[str, Any]:
    """verify's snapshot (the step a flagged run re-runs from), checked like the state's own latent and history."""
    latent = tensors.pop("trusted.latent", None)
    if not (isinstance(entry, dict) and set(entry) == {"step", "recomputed", "history"}
            and is_int_in(entry["step"], 1, step) and isinstance(entry["recomputed"], list)
            and all(is_int_in(s, 1, params.model_calls(sigmas[: entry["step"] + 1])) for s in entry["recomputed"])
            and latent is not None and latent.shape == shape and np.isfinite(latent).all()):
        raise AnimaError(f"{path}: the resume state's verify snapshot is damaged")
    history = _arrays_back("trusted.history", entry["history"] if isinstance(entry["history"], dict) else None,
                           tensors, path)
    _check_history(history, params, sigmas, entry["step"], shape, path)
    return {"step": entry["step"], "latent": latent, "recomputed": entry["recomputed"], "history": history}


def _check_cache(params: GenerationParams, denoise_pass: DenoisePass, state: dict[str, Any], step: int, calls: int,
                 latent_size: int, path: Path) -> None:
    """The cache state restores into this run's cache at exactly `step` finished steps (`calls` model calls done),
    every stored x0 the latent's size: checked now, before any model loads, and never more than an AnimaError."""
    # auto's check keeps the model's first-block tokens ("probe_features"), not latents: the cache checks those.
    # A guided sampler's cache stores its x0 pair (guided, unconditional) as one array of two latents.
    stored_size = latent_size * (2 if SAMPLERS[params.sampler].guided else 1)
    if any(array.size != stored_size for key, value in state.items() if isinstance(value, list)
           and key != "probe_features" for array in value if isinstance(array, np.ndarray)):
        raise AnimaError(f"{path}: the resume state's stored x0 are not the latent's size")
    # a pass's noise stream is its index among the run's passes
    starts = pass_starts(params.call_texts(), denoise_pass.stream)
    cache = pass_cache(denoise_pass.cache, params.model_calls(denoise_pass.sigmas), denoise_pass.cache_options, None,
                       starts)
    try:
        cache = restore_cache(cache, state)  # or verify's re-run, where the state is one
    except AnimaError as e:
        raise AnimaError(f"{path}: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError):
        raise AnimaError(f"{path}: the resume state's cache state is damaged") from None
    sampler, sigmas = SAMPLERS[params.sampler], denoise_pass.sigmas  # the report of a run knows its sigmas
    cache.set_sigmas(np.array([*call_sigmas(sampler, sigmas), sigmas[-1]]),
                     fresh_noise=sampler.adds_noise(params.eta_value, params.s_noise_value))
    if cache.report().calls != calls:
        raise AnimaError(f"{path}: the resume state's cache state is not at step {step}")


def _arrays_back(prefix: str, scalars: dict[str, Any] | None, tensors: dict[str, np.ndarray],
                 path: Path) -> dict[str, Any]:
    """A state() dict again from its stored entries: JSON values as they were, arrays taken out of `tensors`
    back into their lists."""
    if scalars is None:
        raise AnimaError(f"{path}: the resume state's {prefix} entry is damaged")
    state: dict[str, Any] = {}
    for key, entry in scalars.items():
        if isinstance(entry, dict) and set(entry) == {"value"}:
            state[key] = entry["value"]
        elif isinstance(entry, dict) and set(entry) == {"arrays"} and isinstance(entry["arrays"], int) \
                and 0 < entry["arrays"] <= 64:
            state[key] = [tensors.pop(f"{prefix}.{key}.{i}", None) for i in range(entry["arrays"])]
        else:
            raise AnimaError(f"{path}: the resume state's {prefix} entry {shown(key)} is damaged")
    if any(array is None for value in state.values() if isinstance(value, list) for array in value):
        raise AnimaError(f"{path}: the resume state's {prefix} arrays do not match its record")
    return state
