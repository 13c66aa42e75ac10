"""The fp16 rescaling of the decoder's (and the encoder's) residual stream: exact in fp32, and it brings the stream's
peak down."""

from __future__ import annotations

import pytest
import torch

from anima_rknn.vae import load_vae, random_vae
from anima_rknn.vae.preview import varied_images
from anima_rknn.vae.rescale import (
    STREAM_TARGET,
    encoder_stream_peak,
    picture_latents,
    rescale_stream,
    stream_peak,
    stream_scale,
)
from anima_rknn.vae.wan import WanVAEConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def loud_vae(factor: float):
    """A small VAE whose residual stream runs `factor` times larger than its random init's (the image changes,
    the point is the stream's size)."""
    vae = random_vae(WanVAEConfig(dim=8, num_res_blocks=1), seed=2)
    with torch.no_grad():
        vae.decoder.conv1.weight.mul_(factor)
        vae.decoder.conv1.bias.mul_(factor)
    vae.encoder = vae.conv1 = None
    return vae


@pytest.mark.parametrize("scale", [2.0, 1024.0])
def test_rescaling_leaves_the_decoded_image_unchanged_and_divides_the_stream(scale):
    vae = loud_vae(100.0)
    z = torch.randn(2, 16, 6, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before, peak = vae.decode(z), stream_peak(vae, z)
        rescale_stream(vae, scale)
        after = vae.decode(z)
    torch.testing.assert_close(after, before, rtol=0, atol=2e-6)
    assert stream_peak(vae, z) == pytest.approx(peak / scale, rel=1e-5)


@pytest.mark.parametrize("scale", [2.0, 1024.0])
def test_rescaling_the_encoders_stream_leaves_the_latent_unchanged_and_divides_the_stream(scale):
    vae = random_vae(WanVAEConfig(dim=8, num_res_blocks=1), seed=2)
    with torch.no_grad():
        vae.encoder.conv1.weight.mul_(100.0)
        vae.encoder.conv1.bias.mul_(100.0)
        images = varied_images(2, 48)
        before, peak = torch.cat([vae.encode(image[None]) for image in images]), encoder_stream_peak(vae, images)
        decoded = vae.decode(before)
        rescale_stream(vae, scale, encoder=True)
        after = torch.cat([vae.encode(image[None]) for image in images])
        assert torch.equal(vae.decode(before), decoded)  # the decoder is left alone
    torch.testing.assert_close(after, before, rtol=0, atol=2e-5)
    assert encoder_stream_peak(vae, images) == pytest.approx(peak / scale, rel=1e-5)


def test_the_scale_is_the_power_of_two_that_brings_the_peak_under_the_target():
    assert stream_scale(STREAM_TARGET) == 1.0 and stream_scale(10.0) == 1.0
    assert stream_scale(STREAM_TARGET * 1.01) == 2.0 and stream_scale(STREAM_TARGET * 40) == 64.0


def test_calibration_uses_the_encodings_of_pictures_and_drops_the_encoder(tiny_set):
    vae, latents = picture_latents(tiny_set.vae, 2, 64)
    assert latents.shape == (2, 16, 8, 8) and vae.encoder is None
    reference = load_vae(tiny_set.vae, decode_only=False)
    with torch.no_grad():
        encoded = torch.cat([reference.encode(image[None]) for image in varied_images(2, 64)])
    torch.testing.assert_close(latents, encoded)
