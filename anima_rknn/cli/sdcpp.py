"""stable-diffusion.cpp's command line (sd-cli) on ours: its flags that change nothing here, and those we have no
equivalent of, each refused in one line that says what to use instead.

Its flags with an equivalent are spellings in the settings table (generation/params.py: -s, -t, --cfg-scale,
--sampling-method, ...) or on the commands (-m, --diffusion-model, --llm, -b, --preview-path, ...); docs/sdcpp-flags.md
lists them all.
"""

from __future__ import annotations

from collections.abc import Callable

import click

from ..errors import AnimaError

F = Callable[..., object]

# Flags that only say where its ggml backend keeps weights or how it runs attention and convolutions: the picture
# is the same without them, so its documented command lines (docs/anima.md: --offload-to-cpu --diffusion-fa) run.
NO_EFFECT = ("--offload-to-cpu", "--fa", "--diffusion-fa", "--mmap", "--vae-on-cpu", "--clip-on-cpu",
             "--control-net-cpu", "--diffusion-conv-direct", "--vae-conv-direct", "--color", "--eager-load")

_NO_CLIP = "Anima has no CLIP or T5 text encoder: its text encoder is the Qwen3 model, --llm (--text-encoder)"
_NOT_ANIMA = "it is for other model families; Anima has no such part"
_NO_TAE = "no tiny autoencoder here: --preview writes the cheap latent projection, --preview-vae a VAE decode"
_NO_ESRGAN = "no ESRGAN here: --hires with --hires-upscaler lanczos or latent"
_OWN_NOISE = "the noise here is its own seeded generator, the same on every machine (--seed)"
_NO_REF = "no reference images here: --init-img for image to image"
_NO_CONTROLNET = "no ControlNet here"
_NO_SLG = "no skip-layer guidance here"
_IMAGES_ONLY = "images only here"
# Its flags we have no equivalent of, and what to use instead.
REFUSED = {
    "--clip_l": _NO_CLIP, "--clip_g": _NO_CLIP, "--t5xxl": _NO_CLIP,
    "--clip_vision": _NOT_ANIMA, "--llm_vision": _NOT_ANIMA, "--qwen2vl_vision": _NOT_ANIMA,
    "--qwen2vl": "use --llm (sd.cpp's own name for it now) or --text-encoder",
    "--high-noise-diffusion-model": _NOT_ANIMA, "--uncond-diffusion-model": _NOT_ANIMA, "--audio-vae": _NOT_ANIMA,
    "--taesd": _NO_TAE, "--tae": _NO_TAE,
    "--taesd-preview-only": "no tiny autoencoder here: the final image is always the VAE's",
    "--preview-noisy": "previews show each step's denoised estimate",
    "--control-net": _NO_CONTROLNET, "--control-image": _NO_CONTROLNET, "--control-strength": _NO_CONTROLNET,
    "--control-video": _NO_CONTROLNET, "--canny": _NO_CONTROLNET,
    "--embd-dir": "no textual-inversion embeddings here: LoRAs (--lora, --lora-model-dir) are",
    "--tensor-type-rules": "use --dtype (fp32, fp16, bf16 or auto) for the attention/MLP bodies",
    "--type": "quantized weights come from a .gguf DiT (`anima-rknn quantize DIT -o DIT.gguf --type q8_0` writes "
              "one), and --dtype (fp32, fp16, bf16 or auto) sets the attention/MLP bodies' precision",
    "--photo-maker": _NOT_ANIMA, "--pm-id-images-dir": _NOT_ANIMA, "--pm-id-embed-path": _NOT_ANIMA,
    "--pm-style-strength": _NOT_ANIMA, "--pulid-weights": _NOT_ANIMA, "--pulid-id-embedding": _NOT_ANIMA,
    "--pulid-id-weight": _NOT_ANIMA, "--ip-adapter": _NOT_ANIMA, "--ip-adapter-image": _NOT_ANIMA,
    "--ip-adapter-strength": _NOT_ANIMA,
    "--upscale-model": _NO_ESRGAN, "--upscale-repeats": _NO_ESRGAN, "--upscale-tile-size": _NO_ESRGAN,
    "--hires-upscale-tile-size": "the hires upscalers here (latent, lanczos) are not tiled",
    "--hires-upscalers-dir": "no upscaler models here: --hires-upscaler lanczos or latent",
    "--hires-denoising-strength": "use --strength (the hires pass's denoising strength here)",
    "--hires-sigmas": "use --hires-steps with --scheduler",
    "--rng": _OWN_NOISE, "--sampler-rng": _OWN_NOISE,
    "--prediction": "Anima is a flow model; no other prediction type applies",
    "--lora-apply-mode": "LoRAs are merged into the weights before the run",
    "--vae-relative-tile-size": "use --vae-tile-size (in pixels)",
    "--guidance": "Anima has no distilled guidance input: --cfg-scale is its guidance",
    "--img-cfg-scale": "Anima has no image guidance: --cfg-scale is its guidance",
    "--slg-scale": _NO_SLG, "--skip-layer-start": _NO_SLG, "--skip-layer-end": _NO_SLG, "--skip-layers": _NO_SLG,
    "--timestep-shift": "use --flow-shift (--shift)",
    "--sigmas": "use --steps with --scheduler and --flow-shift",
    "--clip-skip": "Anima's text encoder is the Qwen3 model's last hidden state; it has no CLIP layers to skip",
    "--video-frames": _IMAGES_ONLY, "--fps": _IMAGES_ONLY, "--end-img": _IMAGES_ONLY,
    "--motion-module": _IMAGES_ONLY, "--ref-video": _IMAGES_ONLY, "--ref-audio": _IMAGES_ONLY,
    "--ref-video-audio": _IMAGES_ONLY, "--temporal-tiling": _IMAGES_ONLY,
    "--ref-image": _NO_REF,
    "--ref-image-args": _NO_REF,
    "--increase-ref-index": "no reference images here", "--disable-auto-resize-ref-image": "no reference images here",
    "--cache-preset": "use --cache-mode spectrum (or auto) with --cache-option",
    "--scm-mask": "use --cache-option for the spectrum cache",
    "--scm-policy": "use --cache-option for the spectrum cache",
    "--moe-boundary": _NOT_ANIMA, "--vace-strength": _NOT_ANIMA, "--qwen-image-layers": _NOT_ANIMA,
    "--embeddings-connectors": _NOT_ANIMA,
    "--high-noise-steps": _NOT_ANIMA, "--high-noise-cfg-scale": _NOT_ANIMA, "--high-noise-img-cfg-scale": _NOT_ANIMA,
    "--high-noise-guidance": _NOT_ANIMA, "--high-noise-slg-scale": _NOT_ANIMA,
    "--high-noise-skip-layer-start": _NOT_ANIMA, "--high-noise-skip-layer-end": _NOT_ANIMA,
    "--high-noise-eta": _NOT_ANIMA, "--high-noise-sampling-method": _NOT_ANIMA, "--high-noise-skip-layers": _NOT_ANIMA,
    "--circular": "no circular padding here", "--circularx": "no circular padding here",
    "--circulary": "no circular padding here",
    "--chroma-disable-dit-mask": _NOT_ANIMA, "--chroma-enable-t5-mask": _NOT_ANIMA, "--chroma-t5-mask-pad": _NOT_ANIMA,
    "--force-sdxl-vae-conv-scale": _NOT_ANIMA,
    "--prompt-file": "pass the text with -p \"$(cat FILE)\"",
    "--negative-prompt-file": "pass the text with -n \"$(cat FILE)\"",
    "--disable-image-metadata": "the PNG always records how it was made",
    "--mode": "generate makes images (sd-cli's img_gen); other modes have no equivalent",
    "-M": "generate makes images (sd-cli's img_gen); other modes have no equivalent",
    "--convert-name": "no conversion mode here", "--list-devices": "no device list here: --backend torch, onnx or rknn",
    "--rpc-servers": "no RPC backend here: batch --ray spreads jobs over machines",
    "--max-vram": "use --rknn-budget on the rknn backend", "--auto-fit": "use --rknn-budget on the rknn backend",
    "--split-mode": "use --backend and --subgraphs", "--stream-layers": "use --backend and --subgraphs",
    "--params-backend": "use --backend and --subgraphs",
    "--model-args": "give each setting as its own flag", "--extra-sample-args": "give each setting as its own flag",
    "--extra-tiling-args": "use --vae-tiling, --vae-tile-size and --vae-tile-overlap",
    "--vae-format": "the VAE file's format is read from the file",
    "--ad-model": "no ADetailer here: inpaint with --init-img and --mask",
    "--ad-prompt": "no ADetailer here: inpaint with --init-img and --mask",
    "--ad-negative-prompt": "no ADetailer here: inpaint with --init-img and --mask",
    "--extra-ad-args": "no ADetailer here: inpaint with --init-img and --mask",
}


class SdCppCommand(click.Command):
    """A command that refuses stable-diffusion.cpp's flags it has no equivalent of in one line saying what to use
    (click would answer "No such option" with a guess at a flag of ours that means something else)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            if e.option_name in REFUSED:
                raise AnimaError(f"{e.option_name} (stable-diffusion.cpp's) has no equivalent here: "
                                 f"{REFUSED[e.option_name]}") from None
            raise


def _note(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        click.echo(f"note: {param.opts[0]} (stable-diffusion.cpp's) changes nothing here; ignored", err=True)


def no_effect_options(f: F) -> F:
    """NO_EFFECT's flags, hidden, each taken with a note on stderr."""
    for flag in NO_EFFECT:
        f = click.option(flag, is_flag=True, hidden=True, expose_value=False, callback=_note)(f)
    return f
