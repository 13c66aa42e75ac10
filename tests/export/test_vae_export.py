"""export-vae: the VAE decoder (and, with --encoder, the encoder) for one fixed tile as ONNX, checked against torch
through ONNX Runtime, run tile by tile on the onnx backend with the host's blending, and refused for everything it
was not made for."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from anima_rknn.engine.backends.onnx import OnnxBackend
from anima_rknn.engine.vae_tiles import BackendTileDecoder, open_tile_decoder, open_tile_encoder, vae_set_manifest
from anima_rknn.errors import AnimaError
from anima_rknn.export.manifest import read_manifest
from anima_rknn.export.vae import export_vae_decoder, load_vae_set
from anima_rknn.vae import decode_tiled, load_vae, random_vae, save_vae
from anima_rknn.vae.preview import varied_images
from anima_rknn.vae.tiling import encode_tiled

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.usefixtures("one_thread")
TILE, OVERLAP = 64, 16  # tiny_vae_onnx_set's: a 112x112 image takes 2x2 tiles


@pytest.fixture
def vae_set(tiny_vae_onnx_set):
    return tiny_vae_onnx_set


@pytest.fixture(scope="module")
def latent():
    return torch.randn(1, 16, 14, 14, generator=torch.Generator().manual_seed(3))


class TorchTiles:
    """The torch decoder behind the Backend interface: the reference for the host-side tiling."""

    name = "torch"

    def __init__(self, vae):
        self.vae, self.runs = vae, 0

    def run(self, index, inputs):
        self.runs += 1
        return self.vae.decode(torch.from_numpy(inputs["z"])).numpy()

    def close(self):
        pass


def test_the_manifest_pins_vae_tile_and_files(vae_set, tiny_set):
    manifest = read_manifest(vae_set, kind="vae")
    assert manifest["format"] == "anima-rknn-vae/1" and (manifest["tile"], manifest["overlap"]) == (TILE, OVERLAP)
    assert manifest["model"]["file"] == tiny_set.vae.name and manifest["model"]["scale_factor"] == 8
    assert manifest["stream_scale"] == 1.0 and 0 < manifest["stream_peak"] < 2048  # a quiet VAE: nothing to rescale
    entry = manifest["subgraphs"][0]
    assert entry["inputs"] == [{"name": "z", "shape": [1, 16, 8, 8], "dtype": "float32"}]
    assert entry["outputs"] == [{"name": "y", "shape": [1, 3, 64, 64], "dtype": "float32"}]
    assert load_vae_set(vae_set, vae_path=tiny_set.vae, converted=False) == manifest


def test_one_tile_on_onnx_runtime_matches_the_torch_decoder(vae_set, tiny_set, latent):
    vae = load_vae(tiny_set.vae)
    backend = OnnxBackend(vae_set, read_manifest(vae_set, kind="vae"))
    tile = latent[..., 6:, :8]
    got = backend.run(0, {"z": tile.numpy()})
    want = vae.decode(tile).numpy()  # de-normalisation, clamp and [0, 1] mapping all inside the graph
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_tiles_on_a_backend_blend_exactly_as_tiles_on_torch(tiny_set, latent):
    vae = load_vae(tiny_set.vae)
    backend = TorchTiles(vae)
    manifest = {"model": {"scale_factor": 8}, "tile": TILE,
                "subgraphs": [{"inputs": [{"shape": [1, 16, 8, 8]}]}]}
    with torch.no_grad():
        on_backend = decode_tiled(BackendTileDecoder(backend, manifest), latent, TILE, OVERLAP)
        on_torch = decode_tiled(vae, latent, TILE, OVERLAP)
    assert backend.runs == 4 and torch.equal(on_backend, on_torch)  # bit for bit: the same host blending


def test_onnx_tiles_blend_within_the_error_of_one_tile(vae_set, tiny_set, latent):
    vae = load_vae(tiny_set.vae)
    manifest = vae_set_manifest("onnx", vae_set, tiny_set.vae, 112, 112)
    decoder = BackendTileDecoder(OnnxBackend(vae_set, manifest), manifest)
    with torch.no_grad():
        got, want = decode_tiled(decoder, latent, TILE, OVERLAP), decode_tiled(vae, latent, TILE, OVERLAP)
        tiles = [latent[..., y:y + 8, x:x + 8] for y in (0, 6) for x in (0, 6)]
        tile_errors = [float((decoder.decode(tile) - vae.decode(tile)).abs().max()) for tile in tiles]
    # The blend is a convex combination of tiles: it can never be further off than the worst tile.
    assert float((got - want).abs().max()) <= max(tile_errors) + 1e-7
    assert max(tile_errors) < 2e-5


def test_a_latent_of_another_shape_is_refused_in_one_line(vae_set, tiny_set):
    manifest = read_manifest(vae_set, kind="vae")
    decoder = BackendTileDecoder(OnnxBackend(vae_set, manifest), manifest)
    with pytest.raises(AnimaError, match=r"decodes latent tiles of shape \[1, 16, 8, 8\] \(64x64 px\), got"):
        decoder.decode(torch.zeros(1, 16, 4, 8))


def test_refused_for_another_vae_file_a_corrupt_graph_and_too_small_an_image(vae_set, tiny_set, tmp_path):
    other = tmp_path / "other.safetensors"
    save_vae(random_vae(load_vae(tiny_set.vae).config, seed=1), other)
    with pytest.raises(AnimaError, match="was exported from a different VAE file"):
        vae_set_manifest("onnx", vae_set, other, 112, 112)
    with pytest.raises(AnimaError, match="decodes 64x64 tiles, larger than the 48x112 image"):
        vae_set_manifest("onnx", vae_set, tiny_set.vae, 48, 112)
    with pytest.raises(AnimaError, match="needs an exported VAE set"):
        vae_set_manifest("rknn", None, tiny_set.vae, 112, 112)
    broken = tmp_path / "broken"
    shutil.copytree(vae_set, broken)
    (broken / "vae_decoder.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(AnimaError, match="is corrupt"):
        vae_set_manifest("onnx", broken, tiny_set.vae, 112, 112)
    with pytest.raises(AnimaError, match="holds an ONNX VAE decoder, not an .rknn one"):
        vae_set_manifest("rknn", vae_set, tiny_set.vae, 112, 112)


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.update(tile=68), "tile: expected a multiple of the VAE's scale 8, got 68"),
    (lambda m: m.update(overlap=40), "overlap: expected a whole number from 0 to 32, got 40"),
    (lambda m: m["model"].update(scale_factor=3), "model.scale_factor: expected one of 1, 2, 4, 8, got 3"),
    (lambda m: m["subgraphs"][0]["outputs"][0].update(shape=[1, 3, 32, 32]),
     r"subgraphs\[0\].outputs\[0\].shape: expected \[1, 3, 64, 64\]"),
    (lambda m: m["subgraphs"][0].update(file="../vae_decoder.onnx"), "is not a plain file name"),
    (lambda m: m.update(dtype="float16"), 'dtype: expected \'float32\', got \'float16\''),
    (lambda m: m.update(stream_scale=3.0), "stream_scale: expected a power of two, got 3.0"),
    (lambda m: m.update(stream_scale=float("nan")), "stream_scale: expected a number from 1 to"),
    (lambda m: m.update(stream_peak=None, stream_scale=2.0), "stream_scale: expected a number from 1 to 1, got 2.0"),
    (lambda m: m.update(stream_peak="high"), "stream_peak: expected a number from 0 to"),
])
def test_a_crafted_manifest_is_refused_in_one_line(vae_set, tmp_path, change, message):
    crafted = tmp_path / "crafted"
    shutil.copytree(vae_set, crafted)
    manifest = json.loads((crafted / "manifest.json").read_text())
    change(manifest)
    (crafted / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AnimaError, match=message):
        read_manifest(crafted, kind="vae")


def test_an_uncalibrated_set_for_onnx_runtime_only_says_so_and_decodes_the_same(vae_set, tiny_set, tmp_path, latent):
    export_vae_decoder(tiny_set.vae, tmp_path / "fast", TILE, OVERLAP, calibrate=False)
    manifest = load_vae_set(tmp_path / "fast", vae_path=tiny_set.vae, converted=False)
    assert manifest["stream_peak"] is None and manifest["stream_scale"] == 1.0
    z = {"z": latent[..., :8, :8].numpy()}
    calibrated = OnnxBackend(vae_set, read_manifest(vae_set, kind="vae")).run(0, z)
    np.testing.assert_array_equal(OnnxBackend(tmp_path / "fast", manifest).run(0, z), calibrated)  # stream scale 1


def test_dit_and_vae_sets_are_not_taken_for_each_other(vae_set):
    with pytest.raises(AnimaError, match="holds a VAE decoder set, not DiT subgraphs"):
        read_manifest(vae_set)


def test_a_loud_decoder_is_exported_with_its_stream_rescaled_and_decodes_the_same(tiny_set, tmp_path, latent):
    loud = load_vae(tiny_set.vae, decode_only=False)
    with torch.no_grad():  # a residual stream past fp16's 65504, which turns the NPU's image into NaN (README)
        loud.decoder.conv1.weight.mul_(1e6)
        loud.decoder.conv1.bias.mul_(1e6)
    path = tmp_path / "loud.safetensors"
    save_vae(loud, path, dtype=torch.float32)
    export_vae_decoder(path, tmp_path / "set", TILE, OVERLAP)
    manifest = read_manifest(tmp_path / "set", kind="vae")
    assert manifest["stream_peak"] > 65504 and manifest["stream_scale"] >= manifest["stream_peak"] / 2048
    got = OnnxBackend(tmp_path / "set", manifest).run(0, {"z": latent[..., :8, :8].numpy()})
    with torch.no_grad():
        want = loud.decode(latent[..., :8, :8]).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


# ---- the encoder beside the decoder (export-vae --encoder) ---------------------------------------------------------


@pytest.fixture(scope="module")
def encoder_set(tiny_set, tmp_path_factory):
    """export-vae --encoder of the tiny model set's VAE for 64-px tiles, overlap 16 (copy before changing)."""
    folder = tmp_path_factory.mktemp("vae-encoder-onnx")
    export_vae_decoder(tiny_set.vae, folder, TILE, OVERLAP, encoder=True)
    return folder


@pytest.fixture(scope="module")
def pictures():
    return varied_images(2, 112)


def test_the_encoder_sits_beside_the_same_decoder_in_one_set(encoder_set, vae_set, tiny_set):
    manifest = load_vae_set(encoder_set, vae_path=tiny_set.vae, converted=False, encoder=True)
    decoder_only = read_manifest(vae_set, kind="vae")
    assert manifest["subgraphs"][0] == decoder_only["subgraphs"][0]  # the very same decoder graph
    assert {k: v for k, v in manifest.items() if k not in ("subgraphs", "encoder_stream_peak",
                                                           "encoder_stream_scale")} == \
        {k: v for k, v in decoder_only.items() if k != "subgraphs"}
    entry = manifest["subgraphs"][1]
    assert (entry["index"], entry["kind"], entry["file"]) == (1, "vae_encoder", "vae_encoder.onnx")
    assert entry["inputs"] == [{"name": "image", "shape": [1, 3, 64, 64], "dtype": "float32"}]
    assert entry["outputs"] == [{"name": "y", "shape": [1, 16, 8, 8], "dtype": "float32"}]
    # a quiet encoder (2.4-2.8 measured on the tiny VAE): nothing to rescale for fp16
    assert manifest["encoder_stream_scale"] == 1.0 and 0 < manifest["encoder_stream_peak"] < 2048
    assert sorted(p.name for p in encoder_set.iterdir()) == ["manifest.json", "vae_decoder.onnx", "vae_encoder.onnx"]


def test_the_encoder_graph_on_onnx_runtime_is_wanvae_encode_to_float_rounding(encoder_set, tiny_set):
    vae = load_vae(tiny_set.vae, decode_only=False)
    manifest = read_manifest(encoder_set, kind="vae")
    backend = OnnxBackend(encoder_set, {"subgraphs": [manifest["subgraphs"][1]]})
    for picture in varied_images(2, 64):  # real pictures, one tile: the *2-1 and (mu - mean) / std in the graph
        got = backend.run(0, {"image": picture[None].numpy()})
        with torch.no_grad():
            want = vae.encode(picture[None]).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)  # 3e-6 apart measured, latents up to about 1


def test_onnx_encoder_tiles_blend_within_the_error_of_one_tile(encoder_set, tiny_set, pictures):
    vae = load_vae(tiny_set.vae, decode_only=False)
    manifest = vae_set_manifest("onnx", encoder_set, tiny_set.vae, 112, 112, encoder=True)
    encoder = open_tile_encoder("onnx", encoder_set, manifest)
    assert (encoder.scale_factor, encoder.tile) == (8, TILE)
    try:
        with torch.no_grad():
            for picture in pictures:
                image = picture[None]
                got, want = encode_tiled(encoder, image, TILE, OVERLAP), encode_tiled(vae, image, TILE, OVERLAP)
                tiles = [image[..., y:y + 64, x:x + 64] for y in (0, 48) for x in (0, 48)]  # 2x2 tiles of 112 px
                tile_errors = [float((encoder.encode(t) - vae.encode(t)).abs().max()) for t in tiles]
                assert got.shape == (1, 16, 14, 14)
                assert float((got - want).abs().max()) <= max(tile_errors) + 1e-7  # a convex blend of the tiles
                assert max(tile_errors) < 1e-5
        with pytest.raises(AnimaError, match=r"encodes image tiles of shape \[1, 3, 64, 64\] \(64x64 px\), got"):
            encoder.encode(torch.zeros(1, 3, 64, 32))
    finally:
        encoder.close()


def test_the_decoder_of_a_set_with_an_encoder_opens_no_encoder_session(encoder_set, tiny_set, latent):
    manifest = vae_set_manifest("onnx", encoder_set, tiny_set.vae, 112, 112)
    decoder = open_tile_decoder("onnx", encoder_set, manifest)
    assert len(decoder.backend._sessions) == 1  # the decoder's: decoding holds no encoder
    with torch.no_grad():
        np.testing.assert_allclose(decoder.decode(latent[..., :8, :8]), load_vae(tiny_set.vae).decode(
            latent[..., :8, :8]), atol=2e-5)


def test_a_set_without_the_encoder_or_with_a_corrupt_one_is_refused_for_encoding(encoder_set, vae_set, tiny_set,
                                                                                 tmp_path):
    with pytest.raises(AnimaError) as raised:
        vae_set_manifest("onnx", vae_set, tiny_set.vae, 112, 112, encoder=True)
    assert str(raised.value) == (f"the VAE set in {vae_set} has no encoder: export it again with "
                                 "`anima-rknn export-vae --encoder`")
    with pytest.raises(AnimaError, match="has no encoder: export it again"):
        open_tile_encoder("onnx", vae_set, read_manifest(vae_set, kind="vae"))
    broken = tmp_path / "broken"
    shutil.copytree(encoder_set, broken)
    (broken / "vae_encoder.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(AnimaError, match=r"vae_encoder.onnx is corrupt \(sha256 differs from the manifest\)"):
        vae_set_manifest("onnx", broken, tiny_set.vae, 112, 112, encoder=True)
    assert vae_set_manifest("onnx", broken, tiny_set.vae, 112, 112) is not None  # decoding needs the decoder alone


def test_overwriting_a_set_adds_or_drops_the_encoder_and_nothing_else_is_replaced_unasked(tiny_set, vae_set, tmp_path):
    out = tmp_path / "set"
    shutil.copytree(vae_set, out)
    with pytest.raises(AnimaError, match="pass --overwrite"):
        export_vae_decoder(tiny_set.vae, out, TILE, OVERLAP, encoder=True, calibrate=False)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "vae_decoder.onnx"]  # untouched
    export_vae_decoder(tiny_set.vae, out, TILE, OVERLAP, encoder=True, calibrate=False, overwrite=True)
    assert len(load_vae_set(out, vae_path=tiny_set.vae, converted=False, encoder=True)["subgraphs"]) == 2
    export_vae_decoder(tiny_set.vae, out, TILE, OVERLAP, calibrate=False, overwrite=True)  # without --encoder again
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "vae_decoder.onnx"]  # no stale encoder left
    assert len(read_manifest(out, kind="vae")["subgraphs"]) == 1


def test_an_uncalibrated_encoder_says_so_and_encodes_the_same(encoder_set, tiny_set, tmp_path):
    export_vae_decoder(tiny_set.vae, tmp_path / "fast", TILE, OVERLAP, calibrate=False, encoder=True)
    manifest = load_vae_set(tmp_path / "fast", vae_path=tiny_set.vae, converted=False, encoder=True)
    assert manifest["encoder_stream_peak"] is None and manifest["encoder_stream_scale"] == 1.0
    image = {"image": varied_images(1, 64).numpy()}
    calibrated = OnnxBackend(encoder_set, {"subgraphs": read_manifest(encoder_set, kind="vae")["subgraphs"][1:]})
    fast = OnnxBackend(tmp_path / "fast", {"subgraphs": manifest["subgraphs"][1:]})
    np.testing.assert_array_equal(fast.run(0, image), calibrated.run(0, image))


def test_a_loud_encoder_is_exported_with_its_stream_rescaled_and_encodes_the_same(tiny_set, tmp_path):
    loud = load_vae(tiny_set.vae, decode_only=False)
    with torch.no_grad():  # a residual stream past fp16's 65504
        loud.encoder.conv1.weight.mul_(1e5)
        loud.encoder.conv1.bias.mul_(1e5)
    path = tmp_path / "loud.safetensors"
    save_vae(loud, path, dtype=torch.float32)
    export_vae_decoder(path, tmp_path / "set", TILE, OVERLAP, encoder=True)
    manifest = read_manifest(tmp_path / "set", kind="vae")
    assert manifest["encoder_stream_peak"] > 65504 and manifest["stream_scale"] == 1.0
    assert manifest["encoder_stream_scale"] >= manifest["encoder_stream_peak"] / 2048
    image = varied_images(1, 64)
    got = OnnxBackend(tmp_path / "set", {"subgraphs": manifest["subgraphs"][1:]}).run(0, {"image": image.numpy()})
    with torch.no_grad():
        want = loud.encode(image).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_a_decode_only_vae_file_has_no_encoder_to_export(tiny_set, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = {k: v for k, v in load_file(tiny_set.vae).items() if not k.startswith(("encoder.", "conv1."))}
    path = tmp_path / "decoder-only.safetensors"
    save_file(tensors, path)
    with pytest.raises(AnimaError, match="decoder-only.safetensors holds the VAE decoder alone, no encoder: export "
                                         "without --encoder"):
        export_vae_decoder(path, tmp_path / "set", TILE, OVERLAP, encoder=True)
    assert not (tmp_path / "set").exists()
