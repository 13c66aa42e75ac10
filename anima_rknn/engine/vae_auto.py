"""--vae-backend auto: decode on ONNX Runtime or PyTorch, whichever this CPU does faster for the image.

ONNX Runtime runs the decoder's big activations faster than PyTorch (fused norms and SiLUs: 0.72 of torch's
time for a 512-px tile of the full-size VAE here), but only in the fixed tiles of an exported set, which
recompute the overlaps torch's one-piece decode does not. So the choice is per machine (a short probe,
measured once and cached like the dtype's) and per image (the work of each path, counted in decoded pixels).
When ONNX Runtime wins, its set is exported once into the cache folder and reused. The set holds the encoder too
(where the VAE file has one), so image-to-image encodes on ONNX Runtime from the same set; a set cached before
sets had encoders is exported again, whole, the first time it is used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from ..core.cpu_speed import cached_measurement, machine_key
from ..core.files import cache_dir, cached_sha256, exclusive_lock, replaced_folder
from ..core.threads import session_options
from ..errors import AnimaError
from ..export.onnx import export_graph
from ..export.vae import export_vae_decoder, has_encoder, load_vae_set
from ..vae.tiling import tiled_pixels
from ..vae.wan import CausalConv2d, Resample, ResidualBlock, RMSNorm2d

# ONNX Runtime is chosen only when its share of torch's work is below this: the set's one-time export (about one
# decode's time) and the probe's noise are paid for by a clear gain only.
MARGIN = 0.9
_PROBE_FORMAT = "anima-rknn-vae-backend-probe/1"
_PROBE_ROUNDS = 3


def onnx_is_faster(ratio: float, width: int, height: int, tile: int, overlap: int, torch_tile: int | None) -> bool:
    """Whether ONNX Runtime in `tile`-px tiles beats torch in one piece (torch_tile None) or in its own tiles, for
    a width x height image, given the probe's ONNX-Runtime-over-torch time `ratio`.

    The decoder's FLOPs grow with the pixels it decodes, so each path's work is its decoded pixels over the
    image's (the middle attention's quadratic part, which tiling shrinks, is left out: 2% of a 512-px tile's
    FLOPs, 9% of a 1024-px image's). A tile must lie inside the image."""
    if tile > min(width, height):
        return False
    image = width * height
    onnx_work = ratio * tiled_pixels(width, height, tile, overlap) / image
    torch_work = 1.0 if torch_tile is None else tiled_pixels(width, height, torch_tile, overlap) / image
    return onnx_work < MARGIN * torch_work


def _probe_stack() -> torch.nn.Sequential:
    """The decoder's last level in small: 2x nearest upsample + 3x3 conv, a residual block (RMS norm, SiLU,
    3x3 convs) and the head, on activations as large as a tile's (ONNX Runtime's gain is in those)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = [RMSNorm2d(32, file_ndim=4), torch.nn.SiLU(), CausalConv2d(32, 3, 3)]
        return torch.nn.Sequential(Resample(64, up=True, temporal=False), ResidualBlock(32, 32), *head).eval()


_PROBE_INPUT = (1, 64, 192, 192)  # upsampled to 32 x 384 x 384; about 0.2 s per run in torch on one thread


def measure_ratio() -> float:
    """ONNX Runtime's time over torch's for the probe stack, same threads: the median of a few rounds' ratios,
    each round timing both back to back (in turns first), so a burst of load elsewhere spoils one round at most."""
    import onnxruntime

    stack = _probe_stack()
    graph = export_graph(stack, {"x": list(_PROBE_INPUT)}, torch.float32)
    session = onnxruntime.InferenceSession(graph.SerializeToString(), session_options(onnxruntime),  # as OnnxBackend
                                           providers=["CPUExecutionProvider"])
    x = torch.randn(_PROBE_INPUT, generator=torch.Generator().manual_seed(0))
    runs = [lambda: stack(x), lambda: session.run(["y"], {"x": x.numpy()})]  # torch, onnx

    def seconds(run) -> float:  # CPU time: a shared machine's other processes do not count (they would in wall time)
        start = time.process_time()
        run()
        return time.process_time() - start

    ratios = []
    with torch.inference_mode():
        for run in runs:  # untimed: allocators, kernel choice
            run()
        for round_ in range(_PROBE_ROUNDS):
            order = runs if round_ % 2 == 0 else runs[::-1]
            first, second = (seconds(run) for run in order)
            torch_s, onnx_s = (first, second) if round_ % 2 == 0 else (second, first)
            ratios.append(onnx_s / torch_s)
    return float(statistics.median(ratios))


def _valid_ratio(value: object) -> bool:
    return isinstance(value, float) and 0.01 < value < 100


def probe_ratio() -> float:
    """measure_ratio(), once per machine (threads, torch and ONNX Runtime versions included) and cached."""
    import onnxruntime

    key = machine_key(f"onnxruntime {onnxruntime.__version__}")
    return cached_measurement(cache_dir() / "vae-backend-probe.json", _PROBE_FORMAT, key, "onnx_over_torch",
                              _valid_ratio, measure_ratio)


def _onnx_runtime_installed() -> bool:
    """onnxruntime, and onnxscript for the export (the `onnx` extra)."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnxscript"))


def choose_vae_backend(vae_path: Path, width: int, height: int, tile: int, overlap: int, *, tiling: bool,
                       torch_tile: int | None) -> tuple[str, Path | None]:
    """What auto decodes a width x height image with: ("onnx", the cached set of this VAE file and tile) where
    onnx_is_faster, else ("torch", None). Torch without probing when tiles are ruled out (`tiling` False, an
    image smaller than the tile), ONNX Runtime is not installed, or the cache folder cannot be written."""
    if not tiling or tile > min(width, height) or not _onnx_runtime_installed():
        return "torch", None
    if not onnx_is_faster(probe_ratio(), width, height, tile, overlap, torch_tile):
        return "torch", None
    folder = cached_vae_set(vae_path, tile, overlap)
    return ("torch", None) if folder is None else ("onnx", folder)


# ---- the cached ONNX sets --------------------------------------------------------------------------------------

def cached_vae_set(vae_path: Path, tile: int, overlap: int) -> Path | None:
    """The ONNX set of this VAE file for `tile`-px tiles in the cache folder, its encoder included where the file has
    one: exported the first time (one line on stderr) and again when damaged or without the encoder; None when the
    cache folder cannot be written."""
    root = cache_dir() / "vae-onnx"
    folder = root / f"{cached_sha256(vae_path)[:16]}-{tile}-{overlap}"
    encoder = has_encoder(vae_path)
    with contextlib.suppress(AnimaError):
        load_vae_set(folder, vae_path=vae_path, converted=False, encoder=encoder)
        return folder
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(root, os.W_OK | os.X_OK):
        return None
    with exclusive_lock(root / f".{folder.name}.lock"):  # one exporter at a time; the others then find its set
        with contextlib.suppress(AnimaError):
            load_vae_set(folder, vae_path=vae_path, converted=False, encoder=encoder)
            return folder
        print(f"exporting the VAE decoder for ONNX Runtime once into {folder}; --vae-backend torch skips this",
              file=sys.stderr, flush=True)
        with replaced_folder(folder) as staging:  # a damaged set there is replaced whole, a killed export leaves none
            export_vae_decoder(vae_path, staging, tile, overlap, calibrate=False, encoder=encoder)
    load_vae_set(folder, vae_path=vae_path, converted=False, encoder=encoder)
    return folder
