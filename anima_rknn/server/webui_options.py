"""WebUI's settings as /sdapi/v1/options reads and writes them, and as a request's override_settings gives them.

WebUI's clients read the options (SillyTavern's ping, Open WebUI's current model), write them (the model switch:
SillyTavern and webuiapi post {"sd_model_checkpoint": TITLE}; Open WebUI posts back the whole object it read)
and check a key they wrote (WebUI's own API test flips send_seed). So every key of WebUI's own table below is
taken with a value of its default's type (a whole number for a float too, as WebUI's same_type), and answered
back as written; they are kept in the data folder (OPTIONS_FILE, written whole by the atomic writer), the current
model with them, and read back at the next start. What they do:
- sd_model_checkpoint switches the model requests run on by default (any of WebUI's names for a served model);
- a few keys whose other values would change every picture in a way this server does not do (REFUSED below)
  are taken at their default only: storing another value and drawing as before would be a silent lie;
- every other key is a preference of WebUI's own interface, files or memory: stored and returned, no effect.
A key not in the table (WebUI's extensions' keys, its rarer settings), a value of another type, or a model this
server does not serve is a 400 naming it, and nothing of the body is changed.

An options file the server cannot take at start (not JSON, not an object, a key or value it would refuse, a link,
too large) is one warning line: it is moved aside (OPTIONS_FILE + ".bad", replacing an older one) and the server
starts from WebUI's defaults, as a file that cannot be trusted cannot say which of its values were meant.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from ..core.files import Unreadable, read_small_file, write_json
from ..errors import AnimaError
from .requests import BadRequest
from .store import unwritable

CLIP_SKIP = "CLIP_stop_at_last_layers"
MODEL = "sd_model_checkpoint"
OPTIONS_FILE = "webui-options.json"  # in the server's data folder
MAX_OPTIONS_BYTES = 1 << 20  # far above the table's keys and values as JSON
log = logging.getLogger(__name__)

# WebUI's option keys with their defaults (modules/shared_options.py), those its API clients touch and those that
# set how it draws; sd_model_checkpoint is answered with the current model's title.
WEBUI_OPTIONS: dict[str, Any] = {
    "samples_save": True, "samples_format": "png", "samples_filename_pattern": "", "save_images_add_number": True,
    "grid_save": True, "grid_format": "png", "enable_pnginfo": True, "save_txt": False, "jpeg_quality": 80,
    "outdir_samples": "", "outdir_txt2img_samples": "outputs/txt2img-images",
    "outdir_img2img_samples": "outputs/img2img-images", "outdir_extras_samples": "outputs/extras-images",
    "save_to_dirs": True, "upscaler_for_img2img": None, "face_restoration": False,
    "face_restoration_model": "CodeFormer", "code_former_weight": 0.5, "show_warnings": False,
    "memmon_poll_rate": 8, "samples_log_stdout": False, "multiple_tqdm": True,
    MODEL: None, "sd_checkpoints_limit": 1, "sd_checkpoints_keep_in_cpu": True, "sd_checkpoint_cache": 0,
    "sd_checkpoint_hash": "", "sd_unet": "Automatic", "enable_quantization": False, "emphasis": "Original",
    "enable_batch_seeds": True, "comma_padding_backtrack": 20, CLIP_SKIP: 1, "upcast_attn": False,
    "randn_source": "GPU", "tiling": False, "hires_fix_refiner_pass": "second pass", "sd_vae": "Automatic",
    "sd_vae_overrides_per_model_preferences": True, "auto_vae_precision": True, "sd_vae_encode_method": "Full",
    "sd_vae_decode_method": "Full", "inpainting_mask_weight": 1.0, "initial_noise_multiplier": 1.0,
    "img2img_extra_noise": 0.0, "img2img_color_correction": False, "img2img_fix_steps": False,
    "img2img_background_color": "#ffffff", "return_mask": False, "return_mask_composite": False,
    "cross_attention_optimization": "Automatic", "s_min_uncond": 0.0, "token_merging_ratio": 0.0,
    "token_merging_ratio_img2img": 0.0, "token_merging_ratio_hr": 0.0, "pad_cond_uncond": False,
    "persistent_cond_cache": True, "batch_cond_uncond": True, "sd_hypernetwork": "None",
    "extra_networks_default_multiplier": 1.0, "localization": "None", "return_grid": True,
    "do_not_show_images": False, "send_seed": True, "send_size": True, "show_progressbar": True,
    "live_previews_enable": True, "live_preview_content": "Prompt", "live_preview_refresh_period": 1000,
    "show_progress_every_n_steps": 10, "show_progress_type": "Approx NN", "hide_samplers": [],
    "eta_ddim": 0.0, "eta_ancestral": 1.0, "ddim_discretize": "uniform", "s_churn": 0.0, "s_tmin": 0.0,
    "s_tmax": 0.0, "s_noise": 1.0, "k_sched_type": "Automatic", "sigma_min": 0.0, "sigma_max": 0.0, "rho": 0.0,
    "eta_noise_seed_delta": 0, "always_discard_next_to_last_sigma": False, "sgm_noise_multiplier": False,
    "uni_pc_variant": "bh1", "uni_pc_skip_type": "time_uniform", "uni_pc_order": 3,
    "uni_pc_lower_order_final": True, "sd_noise_schedule": "Default", "upscaling_max_images_in_cache": 5,
    "disabled_extensions": [], "disable_all_extensions": "none", "ESRGAN_tile": 192, "ESRGAN_tile_overlap": 8,
    "interrogate_keep_models_in_memory": False, "use_old_emphasis_implementation": False,
    "use_old_karras_scheduler_sigmas": False, "use_old_hires_fix_width_height": False,
    "hires_fix_use_firstpass_conds": False, "use_old_scheduling": False, "lora_functional": False,
    "sd_lora": "None", "lora_preferred_name": "Alias from file", "lora_add_hashes_to_infotext": True,
}
# Keys taken at their default only, with why another value is refused.
REFUSED: dict[str, str] = {
    CLIP_SKIP: "clip skip: this model's text encoder is Qwen3, not CLIP, and it is conditioned on its last layer "
               "only; leave it at 1",
    "eta_noise_seed_delta": "a seed offset (ENSD): this server draws its noise from the seed alone; leave it at 0",
    "sd_vae": "another VAE: each served model runs its own VAE file; leave it at Automatic (or None)",
    "tiling": "seamless tiling is not supported by this server",
    "face_restoration": "face restoration is not supported by this server",
    "sd_hypernetwork": "hypernetworks are not supported by this server (LoRAs are: /sdapi/v1/loras)",
    "initial_noise_multiplier": "an initial noise multiplier is not supported by this server; leave it at 1",
}
# Refused keys' other spellings of the default ("": SillyTavern's VAE when none is chosen from an empty /sd-vae)
_SAME_AS_DEFAULT = {"sd_vae": ("Automatic", "None", "")}


def _json(value: Any) -> str:
    return json.dumps(value)[:60]


def _same_type(value: Any, default: Any) -> bool:
    """WebUI's Options.same_type: numbers are interchangeable (a bool is not one); None takes text."""
    if default is None:
        return value is None or isinstance(value, str)
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    return type(value) is type(default)


def checked_option(key: Any, value: Any, where: str = "options") -> Any:
    """One option as stored: a key of WebUI's table, a value of its default's type, a refused key at its default
    only (a float default keeps a whole number as a float, as WebUI's json)."""
    if key not in WEBUI_OPTIONS:
        raise BadRequest(f"{where}: unknown option {_json(key)}: not one of the WebUI settings this server keeps "
                         "(GET /sdapi/v1/options lists them)")
    default = WEBUI_OPTIONS[key]
    if isinstance(value, float) and not math.isfinite(value):  # JSON's parser takes NaN; no option is one
        raise BadRequest(f"{where} {key}: must be a finite number, got {_json(value)}")
    if not _same_type(value, default):
        kind = "text" if default is None or isinstance(default, str) else type(default).__name__
        raise BadRequest(f"{where} {key}: must be {'a number' if kind in ('int', 'float') else kind}, got "
                         f"{_json(value)}")
    if key in REFUSED and value != default and value not in _SAME_AS_DEFAULT.get(key, ()):
        raise BadRequest(f"{where} {key} {_json(value)}: {REFUSED[key]}")
    if isinstance(default, float) and not isinstance(value, bool):
        return float(value)
    return value


class Options:
    """The options as last written (WebUI's defaults at a first start) and the current model's title (`model`:
    None until one is written). `path`: where they are kept (None: in memory only)."""

    def __init__(self, path: Path | None = None) -> None:
        self.values = {key: value for key, value in WEBUI_OPTIONS.items() if key != MODEL}
        self.model: str | None = None
        self.path = path

    @classmethod
    def kept_in(cls, folder: Path) -> Options:
        """The options kept in `folder` (the data folder), as an earlier run of the server left them."""
        options = cls(folder / OPTIONS_FILE)
        try:
            options._restore()
        except (Unreadable, BadRequest) as e:
            aside = options.path.with_name(OPTIONS_FILE + ".bad")
            try:
                options.path.replace(aside)  # a link is moved itself, never followed
            except OSError as moved:
                aside = f"left in place: cannot move it ({moved.strerror or moved})"
            log.warning("%s not used (%s): %s; WebUI's default options are used", options.path,
                        str(e).splitlines()[0], f"moved to {aside.name}" if isinstance(aside, Path) else aside)
        return options

    def _restore(self) -> None:
        if not (self.path.exists() or self.path.is_symlink()):
            return
        try:
            saved = json.loads(read_small_file(self.path, MAX_OPTIONS_BYTES, no_links=True).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise Unreadable(f"not valid JSON: {type(e).__name__}") from None
        checked = self.checked(saved)  # every key and value as a write would be checked
        model = checked.pop(MODEL, None)
        self.values.update(checked)
        self.model = model

    def write(self, changes: dict[str, Any], model: str) -> None:
        """Checked `changes` and the current model's title, kept: first in the file (StoreError when it cannot be
        written: nothing changes), then here."""
        values = self.values | changes
        if self.path is not None:
            try:
                write_json(self.path, values | {MODEL: model}, overwrite=True)
            except AnimaError as e:
                raise unwritable(e, "its options") from None
        self.values, self.model = values, model

    def checked(self, body: Any) -> dict[str, Any]:
        """Every option of a write, checked before any is stored (the model too, by the caller)."""
        if not isinstance(body, dict):
            raise BadRequest("options must be a JSON object of WebUI's setting names and values")
        return {key: checked_option(key, value) for key, value in body.items()}
