"""Where a model set's files are: a directory laid out like the Hugging Face repo, explicit paths, or the hub."""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from ..core import files
from ..core.tensorfile import read_shapes
from ..errors import AnimaError

HUB_REPO = "circlestone-labs/Anima"
HUB_FILES = {
    "dit": "split_files/diffusion_models/anima-base-v1.0.safetensors",
    "text_encoder": "split_files/text_encoders/qwen_3_06b_base.safetensors",
    "vae": "split_files/vae/qwen_image_vae.safetensors",
}
HUB_TOKENIZERS = {"qwen3": "Qwen/Qwen3-0.6B", "t5": "google/t5-v1_1-xxl"}
PART_NAMES = {"dit": "diffusion model", "text_encoder": "text encoder", "vae": "VAE"}  # the checkpoint files
LAYOUT = {
    "dit": "split_files/diffusion_models",
    "text_encoder": "split_files/text_encoders",
    "vae": "split_files/vae",
    "qwen_tokenizer": "tokenizers/qwen3",
    "t5_tokenizer": "tokenizers/t5",
}

# The tensors whose widths meet, by the end of their names (the files' prefixes vary: net., model., none).
_ADAPTER_SOURCE = "llm_adapter.blocks.0.cross_attn.k_proj.weight"
_TEXT_EMBEDDING = "embed_tokens.weight"
DEMO_MODEL = Path(__file__).resolve().parents[1] / "demo_model"  # shipped in the package (see anima_rknn.demo)
# The real Qwen3 and T5 tokenizers, xz-compressed (1.8 MB; tokenizers/README.md says where they come from): what a
# model set uses when it brings none, so that the three model files alone are enough.
SHIPPED_TOKENIZERS = {"qwen_tokenizer": Path(__file__).resolve().parent / "tokenizers" / "qwen3",
                      "t5_tokenizer": Path(__file__).resolve().parent / "tokenizers" / "t5"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.json.xz")  # text.tokenizers reads either


def _shape_ending(shapes: dict[str, tuple[int, ...]], suffix: str) -> tuple[int, ...] | None:
    return next((shape for name, shape in shapes.items() if name == suffix or name.endswith("." + suffix)), None)


def demo_model_dir() -> Path:
    """The shipped demo model set (model-directory layout)."""
    if not (DEMO_MODEL / "split_files").is_dir():
        raise AnimaError(f"the demo model is missing from this install ({DEMO_MODEL}); pass --model DIR")
    return DEMO_MODEL


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    dit: Path
    text_encoder: Path
    vae: Path
    qwen_tokenizer: Path  # a folder holding tokenizer.json
    t5_tokenizer: Path

    def check(self) -> ModelFiles:
        for field in ("dit", "text_encoder", "vae"):
            path = getattr(self, field)
            if not path.is_file():
                raise AnimaError(f"{field.replace('_', ' ')} file not found: {path}")
        for field in ("qwen_tokenizer", "t5_tokenizer"):
            path = getattr(self, field)
            if not _has_tokenizer(path):
                raise AnimaError(f"{field.replace('_', ' ')}: no tokenizer.json in {path}")
        self._check_text_width()
        return self

    def _check_text_width(self) -> None:
        """The DiT's LLM adapter reads the text encoder's hidden states: their widths must agree, checked on the
        headers now rather than as a matrix-shape error after both models load. A file whose header lacks the
        tensors is left to its loader, which names what is wrong with it."""
        try:
            dit = _shape_ending(read_shapes(self.dit, "DiT"), _ADAPTER_SOURCE)
            text = _shape_ending(read_shapes(self.text_encoder, "text encoder"), _TEXT_EMBEDDING)
        except AnimaError:
            return
        if dit is None or text is None or len(dit) != 2 or len(text) != 2 or dit[1] == text[1]:
            return
        raise AnimaError(f"the DiT and the text encoder are not parts of one model: {self.dit.name}'s LLM adapter "
                         f"reads {dit[1]}-wide text states, {self.text_encoder.name} makes {text[1]}-wide ones")


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def tokenizers_for(dit: Path | None, root: Path | None = None) -> dict[str, Path]:
    """The tokenizer folders of a model set that names none: a model directory's tokenizers/ where it has one
    (`root`), else those of the Hugging Face layout beside the diffusion model (in its folder or up to two above:
    ROOT/tokenizers/ for ROOT/split_files/diffusion_models/DIT), else the shipped real Qwen3 and T5 tokenizers."""
    if root is not None and (root / "tokenizers").exists():  # its own, checked as they are
        return {part: root / LAYOUT[part] for part in SHIPPED_TOKENIZERS}
    for place in list(Path(dit).resolve().parents)[:3] if dit is not None else []:
        found = {part: place / LAYOUT[part] for part in SHIPPED_TOKENIZERS}
        if all(_has_tokenizer(folder) for folder in found.values()):
            return found
    return dict(SHIPPED_TOKENIZERS)


def single_safetensors(folder: Path, what: str) -> Path:
    """The one checkpoint in a folder of the layout: a .safetensors file or a GGUF (.gguf) in its place."""
    if not folder.is_dir():
        raise AnimaError(f"model directory has no {what} folder: {folder}")
    found = sorted([*folder.glob("*.safetensors"), *folder.glob("*.gguf")])
    if len(found) != 1:
        listing = ", ".join(p.name for p in found) or "none"
        raise AnimaError(f"expected one {what} .safetensors or .gguf in {folder}, found {listing}; "
                         "pass the file explicitly")
    return found[0]


def part_file(model_dir: Path | None, given: Path | None, part: str) -> Path:
    """One file of a model set for a command that needs only it: `given` (--dit / --vae FILE), or the one in
    --model DIR's layout; neither means the shipped demo model's."""
    flag = "--" + part.replace("_", "-")
    if model_dir is not None and given is not None:
        raise AnimaError(f"pass one of --model DIR or {flag} FILE, not both")
    if given is not None:
        return given
    if model_dir is None:
        return getattr(resolve(None), part)
    return single_safetensors(model_dir / LAYOUT[part], PART_NAMES[part])


def from_model_dir(root: str | os.PathLike) -> ModelFiles:
    root = Path(root)
    if not root.is_dir():
        raise AnimaError(f"model directory not found: {root}")
    parts = {part: single_safetensors(root / LAYOUT[part], name) for part, name in PART_NAMES.items()}
    return ModelFiles(**parts, **tokenizers_for(None, root)).check()


def resolve(model: str | os.PathLike | None, **explicit: str | os.PathLike | None) -> ModelFiles:
    """A model directory, overridden file by file by explicit paths; a hub id is fetched first.
    Nothing at all given means the shipped demo model."""
    if model is None and not any(explicit.values()):
        model = demo_model_dir()
    if model is not None and not Path(model).exists() and str(model).count("/") == 1 and str(model) == HUB_REPO:
        model = download_from_hub(str(model))
    base = dataclasses.asdict(from_model_dir(model)) if model is not None else {}
    given = {k: Path(v) for k, v in explicit.items() if v is not None}
    if not base:  # the three model files alone: their tokenizers are found beside them, or the shipped ones
        given = tokenizers_for(given.get("dit")) | given
    missing = [k for k in LAYOUT if k not in base and k not in given]
    if missing:
        flags = " ".join(f"--{k.replace('_', '-')}" for k in missing)
        raise AnimaError(f"no model given: pass --model DIR, or all of {flags}")
    return ModelFiles(**{**base, **given}).check()


def download_from_hub(repo: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Fetch the three checkpoint files and both tokenizers into the model-directory layout."""
    from huggingface_hub import constants, hf_hub_download

    root = Path(cache_dir or files.cache_dir() / repo.replace("/", "--"))
    wanted = [(repo, f, root) for f in HUB_FILES.values()]
    wanted += [(tok_repo, "tokenizer.json", root / LAYOUT[f"{name}_tokenizer"]) for name, tok_repo in
               (("qwen", HUB_TOKENIZERS["qwen3"]), ("t5", HUB_TOKENIZERS["t5"]))]
    try:
        if constants.HF_HUB_OFFLINE:
            raise ConnectionError("HF_HUB_OFFLINE is set")
        _probe(constants.ENDPOINT)  # fail in seconds, not after the client's retries with back-off
        for repo_id, filename, local_dir in wanted:
            hf_hub_download(repo_id, filename, local_dir=local_dir, etag_timeout=5)
    except Exception as e:  # any network or hub failure ends in the same advice
        raise AnimaError(
            f"cannot download from the Hugging Face hub ({type(e).__name__}). Download by hand: from {repo} "
            f"{', '.join(HUB_FILES.values())}; tokenizer.json from {HUB_TOKENIZERS['qwen3']} into "
            f"DIR/{LAYOUT['qwen_tokenizer']}/ and from {HUB_TOKENIZERS['t5']} into DIR/{LAYOUT['t5_tokenizer']}/; "
            "then pass --model DIR"
        ) from None
    return root


def _probe(endpoint: str, timeout: float = 3.0) -> None:
    url = urlparse(endpoint)
    with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
        pass
