"""A whole generation against diffusers' own Anima pipeline (AnimaAutoBlocks) on the same model files.

Both sides read the same tiny model set: ours through AnimaPipeline, diffusers through transformers' Qwen3Model,
AnimaTextConditioner, CosmosTransformer3DModel and AutoencoderKLQwenImage loaded from the raw safetensors with
the formats.md key tables. Same prompts, same initial noise, Euler over the same sigmas, CFG 4, fp32; and an
img2img run through diffusers' Anima img2img blocks (same image, strength, noise).
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from anima_rknn.demo.tiny_set import TEXT_ENCODERS, VAES, write_model_set
from anima_rknn.generation.images import ImageInput
from anima_rknn.generation.params import DEFAULT_NEGATIVE, GenerationParams
from anima_rknn.generation.pipeline import AnimaPipeline, initial_noise
from anima_rknn.model.config import PRESETS
from anima_rknn.model.model_set import ModelFiles
from anima_rknn.sampling.schedule import flow_sigmas

pytest.importorskip("diffusers")
from diffusers import AnimaTextConditioner, AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler  # noqa: E402
from diffusers.guiders import ClassifierFreeGuidance  # noqa: E402
from diffusers.modular_pipelines import AnimaAutoBlocks, SequentialPipelineBlocks  # noqa: E402
from diffusers.modular_pipelines.anima.before_denoise import AnimaTextConditioningStep  # noqa: E402
from diffusers.modular_pipelines.anima.encoders import AnimaTextEncoderStep  # noqa: E402
from diffusers_reference import ADAPTER_PREFIX, diffusers_dit, diffusers_vae  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model  # noqa: E402

# Both prompts non-empty: for "" diffusers encodes zero Qwen states under an all-zero mask, while Anima
# (ComfyUI, stable-diffusion.cpp, anima.md) encodes the single token <|endoftext|>. No "(word:1.2)" weights
# either: diffusers has no prompt-weight syntax and would tokenize the brackets as text.
PROMPT = "1girl, solo, long hair, looking at viewer, smile, blue sky"
NEGATIVE = "worst quality, low quality, blurry, jpeg artifacts"
WIDTH = HEIGHT = 64
STEPS = 8
CFG = 4.0
SEED = 7
SHIFT = 3.0
# The unshifted t of ComfyUI's "simple" schedule (anima.md); diffusers' scheduler shifts it and appends 0.
SIMPLE_T = [(1000 - int(k * 1000 / STEPS)) / 1000 for k in range(STEPS)]


def _reference_components(files: ModelFiles) -> dict[str, object]:
    """diffusers' Anima components built from the model set's files, without any of our loaders."""
    dit_file = {k.removeprefix("net."): v for k, v in load_file(str(files.dit)).items()}
    adapter_state = {k.removeprefix(ADAPTER_PREFIX): v.float()
                     for k, v in dit_file.items() if k.startswith(ADAPTER_PREFIX)}
    config = dataclasses.replace(PRESETS["tiny"], t5_vocab=adapter_state["embed.weight"].shape[0])
    conditioner = AnimaTextConditioner(
        source_dim=config.adapter_source_dim, target_dim=config.context_dim, model_dim=config.context_dim,
        num_layers=config.adapter_blocks, num_attention_heads=config.adapter_heads,
        mlp_ratio=config.adapter_mlp / config.context_dim, target_vocab_size=config.t5_vocab,
        min_sequence_length=config.context_tokens,
    ).eval()  # fmt: skip
    conditioner.load_state_dict(adapter_state, strict=True)

    encoder_state = {k.removeprefix("model."): v.float() for k, v in load_file(str(files.text_encoder)).items()}
    sizes = TEXT_ENCODERS["tiny"]
    encoder = Qwen3Model(Qwen3Config(
        vocab_size=encoder_state["embed_tokens.weight"].shape[0], hidden_size=config.adapter_source_dim,
        num_hidden_layers=sizes["layers"], num_attention_heads=sizes["heads"], num_key_value_heads=sizes["kv_heads"],
        head_dim=sizes["head_dim"], intermediate_size=sizes["intermediate"], rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )).eval()  # fmt: skip
    encoder.load_state_dict(encoder_state, strict=True)

    # PreTrainedTokenizerFast runs tokenizer.json as is; transformers 5's T5 classes rebuild its normaliser.
    return {
        "text_encoder": encoder,
        "tokenizer": PreTrainedTokenizerFast(tokenizer_file=str(files.qwen_tokenizer / "tokenizer.json"),
                                             pad_token="<|endoftext|>"),
        "t5_tokenizer": PreTrainedTokenizerFast(tokenizer_file=str(files.t5_tokenizer / "tokenizer.json"),
                                                pad_token="<pad>", eos_token="</s>"),
        "text_conditioner": conditioner,
        "transformer": diffusers_dit(config, dit_file),
        "vae": diffusers_vae(files.vae, VAES["tiny"]),
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=SHIFT),
        "guider": ClassifierFreeGuidance(guidance_scale=CFG),
    }


def _relative(ours: np.ndarray | torch.Tensor, reference: np.ndarray | torch.Tensor) -> float:
    difference = np.asarray(ours, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    return float(np.linalg.norm(difference) / np.linalg.norm(np.asarray(reference, dtype=np.float64)))


def test_generation_matches_diffusers_anima_pipeline(tiny_set: ModelFiles) -> None:
    torch.manual_seed(0)
    reference = AnimaAutoBlocks().init_pipeline()
    reference.update_components(**_reference_components(tiny_set))
    # The tiny VAE must carry the statistics diffusers ships for this VAE, or the decode would differ by design.
    defaults = inspect.signature(AutoencoderKLQwenImage.__init__).parameters
    assert list(reference.vae.config.latents_mean) == defaults["latents_mean"].default
    assert list(reference.vae.config.latents_std) == defaults["latents_std"].default

    noise = torch.from_numpy(initial_noise(SEED, WIDTH, HEIGHT))
    theirs = reference(
        prompt=PROMPT, negative_prompt=NEGATIVE, height=HEIGHT, width=WIDTH, sigmas=SIMPLE_T,
        latents=noise[:, :, None], output_type="np",
        output=["prompt_embeds", "negative_prompt_embeds", "latents", "images"],
    )  # fmt: skip
    np.testing.assert_allclose(reference.scheduler.sigmas.numpy(), flow_sigmas(STEPS, SHIFT), rtol=0, atol=2e-7)

    params = GenerationParams(prompt=PROMPT, negative=NEGATIVE, width=WIDTH, height=HEIGHT, steps=STEPS, cfg=CFG,
                              seed=SEED, shift=SHIFT, dtype="fp32")
    ours = AnimaPipeline(tiny_set).generate(params)

    # Text stage: the 512 context rows, zero padding included.
    assert _relative(ours.conditioning.positive, theirs["prompt_embeds"]) < 1e-5  # measured 0 (bit-equal)
    assert _relative(ours.conditioning.negative, theirs["negative_prompt_embeds"]) < 1e-5

    # Final latent after 8 Euler steps of 2 passes each. fp32 on both sides; the two differ only in summation order
    # (attention kernels, x0- vs v-form Euler update, sigma*1000/1000 in float32): measured 2.0e-6 relative, 2.2e-5
    # max (latent values up to 6.5). The bounds keep >20x margin for other CPUs and thread counts and stay ~40x
    # below the change a 1% different CFG scale (4.04) makes (1.9e-3 relative); another prompt moves it by 0.2.
    latent = theirs["latents"][:, :, 0].numpy()
    assert ours.latent.shape == latent.shape == (1, 16, HEIGHT // 8, WIDTH // 8)
    assert _relative(ours.latent, latent) < 5e-5
    assert np.abs(ours.latent - latent).max() < 5e-4
    assert _relative(noise, latent) > 0.3  # the sampler really moved the latent away from the noise

    # VAE decode and [-1,1] -> 8-bit: equal up to rounding to the nearest level.
    pixels = np.round(theirs["images"][0] * 255)
    assert pixels.std() > 10  # not a flat image
    assert np.abs(np.asarray(ours.image, dtype=np.float64) - pixels).max() <= 1


@pytest.fixture(scope="module")
def real_tokenizer_set(tmp_path_factory: pytest.TempPathFactory, real_tokenizers: Path) -> ModelFiles:
    return write_model_set(tmp_path_factory.mktemp("models") / "real-tok", "tiny", tokenizers=real_tokenizers, seed=3)


def test_text_stage_with_real_tokenizers_matches_diffusers(real_tokenizer_set: ModelFiles) -> None:
    # Byte-level BPE and SentencePiece Unigram through transformers on the diffusers side, `tokenizers` on ours.
    blocks = SequentialPipelineBlocks.from_blocks_dict(
        {"text_encoder": AnimaTextEncoderStep(), "text_conditioning": AnimaTextConditioningStep()})
    reference = blocks.init_pipeline()
    needed = {spec.name for spec in blocks.expected_components}
    reference.update_components(**{k: v for k, v in _reference_components(real_tokenizer_set).items() if k in needed})
    prompt = "masterpiece, best quality, hatsune_miku, twintails, café au lait, score_9, 1024x1024"
    theirs = reference(prompt=prompt, negative_prompt=DEFAULT_NEGATIVE,
                       output=["t5_input_ids", "prompt_embeds", "negative_prompt_embeds"])
    ours = AnimaPipeline(real_tokenizer_set).encode(prompt, DEFAULT_NEGATIVE)
    assert theirs["t5_input_ids"].shape[1] > 20  # a real tokenization, not a handful of <unk>
    assert _relative(ours.positive, theirs["prompt_embeds"]) < 1e-5
    assert _relative(ours.negative, theirs["negative_prompt_embeds"]) < 1e-5


@pytest.mark.parametrize("strength", [0.5, 0.8])
def test_img2img_matches_diffusers_anima_img2img_blocks(tiny_set: ModelFiles, tmp_path: Path, strength: float) -> None:
    # diffusers 0.42's AnimaAutoBlocks take the img2img route when given an image: VAE encode (posterior mode),
    # get_timesteps(strength) slices the schedule, scale_noise mixes the given noise in at the first kept sigma.
    torch.manual_seed(0)
    reference = AnimaAutoBlocks().init_pipeline()
    reference.update_components(**_reference_components(tiny_set))
    rng = np.random.default_rng(11)
    pixels = np.clip(rng.normal(128, 50, (HEIGHT // 8, WIDTH // 8, 3)), 0, 255).astype(np.uint8)
    picture = Image.fromarray(pixels).resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC)  # smooth, not white noise
    picture.save(tmp_path / "init.png")
    noise = torch.from_numpy(initial_noise(SEED, WIDTH, HEIGHT))
    theirs = reference(
        prompt=PROMPT, negative_prompt=NEGATIVE, image=picture, strength=strength, height=HEIGHT, width=WIDTH,
        sigmas=SIMPLE_T, latents=noise[:, :, None], output_type="np", output=["image_latents", "latents", "images"],
    )  # fmt: skip

    params = GenerationParams(prompt=PROMPT, negative=NEGATIVE, width=WIDTH, height=HEIGHT, steps=STEPS, cfg=CFG,
                              seed=SEED, shift=SHIFT, dtype="fp32", vae_backend="torch",
                              init_image=ImageInput.from_path(tmp_path / "init.png"), strength=strength)
    pipeline = AnimaPipeline(tiny_set)
    encoded, _ = pipeline.encode_image(picture, pipeline.prepare(params).decode)
    # The encoder: the same normalised posterior mean (fp32 both; summation order only).
    assert _relative(encoded, theirs["image_latents"][:, :, 0]) < 1e-5
    ours = pipeline.generate(params)
    assert ours.summary(None)["passes"][0]["steps_run"] == STEPS - int(STEPS - STEPS * strength)
    latent = theirs["latents"][:, :, 0].numpy()
    # As the text-to-image parity above: fp32 on both sides, the same truncated Euler run.
    assert _relative(ours.latent, latent) < 5e-5
    assert np.abs(ours.latent - latent).max() < 5e-4
    assert np.abs(np.asarray(ours.image, dtype=np.float64) - np.round(theirs["images"][0] * 255)).max() <= 1
