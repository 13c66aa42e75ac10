"""`make-tiny`: a complete random-weight model set in the real file formats and the model-directory layout."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from ..core.files import check_name, check_space, held_folder, output_folder, replaced_folder, write_bytes
from ..errors import AnimaError
from ..checks import is_int_in, shown
from ..model.config import MAX_BLOCKS, PRESETS, DiTConfig
from ..model.dit import AnimaDiT
from ..model.io import random_dit, save_dit
from ..model.model_set import LAYOUT, ModelFiles, from_model_dir
from ..text import build_word_tokenizers, write_random_text_encoder
from ..vae import WanVAEConfig, file_shapes, random_vae, save_vae
from ..vae.preview import store_projection

# Enough words for prompts people try first; anything else maps to the unknown token.
WORDS = (
    "a an the of on in at with and or 1girl 1boy solo girl boy cat dog woman man long short hair eyes smile "
    "looking viewer red orange yellow green blue purple pink white black brown gray silver gold background "
    "circle square triangle star heart sky sea forest city night day sun moon flower flowers tree trees "
    "mountain river dress shirt hat school uniform portrait landscape anime style masterpiece best worst "
    "quality low high detailed blurry jpeg artifacts sepia score _ 1 2 3 , . top bottom left right "
    "center middle small large big cute happy sitting standing holding"
).split()

# Sizes of the text encoder and VAE that go with each DiT preset (the encoder width feeds the adapter).
TEXT_ENCODERS = {
    "tiny": dict(layers=2, heads=2, kv_heads=1, head_dim=32, intermediate=128),
    "mid": dict(layers=4, heads=4, kv_heads=2, head_dim=64, intermediate=512),
    "full": dict(layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
}
VAES = {
    "tiny": WanVAEConfig(dim=16, num_res_blocks=1),
    "mid": WanVAEConfig(dim=32, num_res_blocks=1),
    "full": WanVAEConfig(),
}
FULL_QWEN_VOCAB = 151936


def write_model_set(out: Path, preset: str = "tiny", tokenizers: Path | None = None, seed: int = 0,
                    overwrite: bool = False, blocks: int | None = None) -> ModelFiles:
    """Write DiT+adapter, Qwen3 and Wan VAE files with seeded random weights, plus both tokenizers and the VAE's
    preview projection. `blocks`: the DiT's block count instead of the preset's (the full preset with 40 is the
    community Anima-2.9B's shape: 120 subgraphs).

    `tokenizers` may name a folder holding the real `qwen3/` and `t5/` tokenizers; otherwise small word-level
    ones are built. Vocabulary sizes follow the tokenizers (the full preset keeps the real model's sizes).
    """
    if preset not in PRESETS:
        raise AnimaError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if blocks is not None and not is_int_in(blocks, 1, MAX_BLOCKS):
        raise AnimaError(f"a DiT has 1 to {MAX_BLOCKS} blocks, not {shown(blocks)}")
    out = check_name(out)  # before anything looks at it: a name too long is an OSError there
    holds = "a model set" if (out / "split_files").exists() else "other files"
    check_space(out.parent, estimated_size(preset, blocks), f"a {preset} model set")  # before a byte is written
    with held_folder(lambda: output_folder(out, overwrite=overwrite, holds=holds)):  # one writer at a time
        # Written whole into a hidden staging folder that then takes out's place: a failed run (a full disk)
        # leaves no folder that a later run could take for a model set.
        with replaced_folder(out) as staging:
            _write_set(staging, preset, tokenizers, seed, blocks)
        return from_model_dir(out)


def estimated_size(preset: str, blocks: int | None = None) -> int:
    """About the bytes a `preset` set takes (bfloat16 weights; the tokenizers and vocabularies of the small
    presets are a few hundred KiB), from the models' shapes alone (no weights made)."""
    config = dataclasses.replace(PRESETS[preset], blocks=blocks or PRESETS[preset].blocks)
    with torch.device("meta"):
        dit = AnimaDiT(config)
    weights = sum(p.numel() for p in dit.state_dict().values())
    weights += sum(math.prod(shape) for shape in file_shapes(VAES[preset]).values())
    encoder = TEXT_ENCODERS[preset]
    vocab = FULL_QWEN_VOCAB if preset == "full" else 4096
    width, attention = config.adapter_source_dim, encoder["head_dim"] * (encoder["heads"] * 2 + encoder["kv_heads"] * 2)
    weights += vocab * width + encoder["layers"] * width * (attention + 3 * encoder["intermediate"])
    return 2 * weights + (1 << 20)


def _write_set(out: Path, preset: str, tokenizers: Path | None, seed: int, blocks: int | None) -> None:
    qwen_dir, t5_dir = out / LAYOUT["qwen_tokenizer"], out / LAYOUT["t5_tokenizer"]
    for d in (qwen_dir, t5_dir, out / LAYOUT["dit"], out / LAYOUT["text_encoder"], out / LAYOUT["vae"]):
        d.mkdir(parents=True, exist_ok=True)
    if tokenizers is not None:
        for name, dest in (("qwen3", qwen_dir), ("t5", t5_dir)):
            source = Path(tokenizers) / name / "tokenizer.json"
            if not source.is_file():
                raise AnimaError(f"no tokenizer.json in {source.parent}")
            write_bytes(dest / "tokenizer.json", source.read_bytes(), overwrite=True)
    else:
        build_word_tokenizers(list(WORDS), qwen_dir, t5_dir)
    qwen_vocab, t5_vocab = _vocab_size(qwen_dir), _vocab_size(t5_dir)

    config: DiTConfig = PRESETS[preset]
    if preset == "full":
        qwen_vocab, t5_vocab = FULL_QWEN_VOCAB, config.t5_vocab
    config = dataclasses.replace(config, t5_vocab=max(t5_vocab, 1), blocks=blocks or config.blocks)
    name = preset if blocks is None else f"{preset}-{blocks}blocks"
    save_dit(random_dit(config, seed), out / LAYOUT["dit"] / f"anima-{name}-random.safetensors")
    write_random_text_encoder(out / LAYOUT["text_encoder"] / f"qwen3-{preset}-random.safetensors",
                              hidden=config.adapter_source_dim, vocab=qwen_vocab, seed=seed + 1,
                              **TEXT_ENCODERS[preset])
    vae_path = out / LAYOUT["vae"] / f"wan-vae-{preset}-random.safetensors"
    save_vae(random_vae(VAES[preset], seed=seed + 2), vae_path)
    store_projection(vae_path)  # the live preview's latent-to-RGB projection (a minute for the full VAE)


def _vocab_size(tokenizer_dir: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()

