"""Every way a checkpoint file can be wrong ends in one line that names the problem."""

import pickle
import struct

import pytest
import torch
from crafted_files import edited, planted_pickle, split, write

from anima_rknn.core.tensorfile import (
    DTYPE_BYTES,
    check_shapes,
    load_tensors,
    read_header,
    read_metadata,
    read_shapes,
    save_tensors,
)
from anima_rknn.errors import AnimaError
from anima_rknn.model.io import load_dit, read_dit_config, trained_image_size
from anima_rknn.text.encoder import load_text_encoder
from anima_rknn.vae.io import load_vae, read_vae_config

READERS = [read_shapes, read_metadata, load_tensors]


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "a.safetensors"
    save_tensors({"net.w": torch.ones(4, 3), "net.b": torch.zeros(5)}, path, {"k": "v"})
    return path


def f32(begin, end, shape):
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


def assert_refused(path, pattern, readers=READERS):
    for reader in readers:
        with pytest.raises(AnimaError, match=pattern) as caught:
            reader(path, "DiT")
        message = str(caught.value)
        assert "\n" not in message and str(path) in message, message


def test_round_trip_and_prefix_strip(checkpoint):
    assert read_shapes(checkpoint, "DiT") == {"net.w": (4, 3), "net.b": (5,)}
    assert read_metadata(checkpoint, "DiT") == {"k": "v"}
    tensors = load_tensors(checkpoint, "DiT", strip=("net.",), skip=("b",))
    assert list(tensors) == ["w"] and torch.equal(tensors["w"], torch.ones(4, 3))


def test_header_offsets_match_the_writer(checkpoint):
    header, data = split(checkpoint)
    found = read_header(checkpoint, "DiT")
    assert found.metadata == {"k": "v"}
    for name, info in found.tensors.items():
        assert (info.dtype, list(info.shape), [info.begin, info.end]) == (
            header[name]["dtype"], header[name]["shape"], header[name]["data_offsets"])
    assert max(info.end for info in found.tensors.values()) == len(data)


def test_converted_tensors(checkpoint):
    tensors = load_tensors(checkpoint, "DiT", convert=torch.bfloat16)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert torch.equal(tensors["net.w"], torch.ones(4, 3, dtype=torch.bfloat16))


def test_missing_file(tmp_path):
    with pytest.raises(AnimaError, match="DiT file not found"):
        read_shapes(tmp_path / "nope.safetensors", "DiT")


@pytest.mark.parametrize("keep", [4, 30, -8])
def test_truncated_file(checkpoint, keep):
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[:keep] if keep > 0 else data[:keep])
    with pytest.raises(AnimaError, match="truncated"):
        load_tensors(checkpoint, "DiT")


def test_truncated_data_names_the_missing_bytes(checkpoint):
    checkpoint.write_bytes(checkpoint.read_bytes()[:-7])
    assert_refused(checkpoint, "is truncated: 7 bytes missing$")


def test_not_a_safetensors_file(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_text("hello, this is text and not a checkpoint at all")
    with pytest.raises(AnimaError, match="truncated or not a safetensors file"):
        read_shapes(path, "VAE")


def _edit(change):
    """A case that edits the real header of the `checkpoint` fixture (net.b then net.w, F32)."""
    return lambda path: edited(path, path, change)


def _raw(header, data=b""):
    return lambda path: write(path, header, data)


def _bytes(raw):
    def make(path):
        path.write_bytes(raw)
        return path
    return make


def _set(name, key, value):
    return _edit(lambda header: header[name].__setitem__(key, value))


def _drop(name, key):
    return _edit(lambda header: header[name].pop(key))


BAD_HEADERS = {
    "list": (_raw([1, 2]), r"not a safetensors file \(its header is a JSON list, not an object\)"),
    "string": (_raw("tensors"), "header is a JSON str, not an object"),
    "number": (_raw(7), "header is a JSON int, not an object"),
    "not utf-8": (_raw(b'{"net.\xff": 1}'), "header is not UTF-8 text"),
    "not json": (_raw(b'{"net.w": '), r"not a safetensors file \(header: Expecting value"),
    "too deep": (_raw(b"[" * 100_000), "nests too deeply"),
    "duplicate name": (_raw(b'{"a": {}, "a": {}}'), r"\(header: duplicate name a\)"),
    "metadata value": (_edit(lambda h: h["__metadata__"].__setitem__("k", 1)), "__metadata__ k is a JSON int"),
    "metadata list": (_edit(lambda h: h.__setitem__("__metadata__", ["k", "v"])), "__metadata__ is a JSON list"),
    "entry not object": (_edit(lambda h: h.__setitem__("net.b", [0, 20])),
                         "tensor net.b is a JSON list, expected an object"),
    "no dtype": (_drop("net.w", "dtype"), "tensor net.w has no dtype$"),
    "no shape": (_drop("net.w", "shape"), "tensor net.w has no shape$"),
    "no offsets": (_drop("net.w", "data_offsets"), "tensor net.w has no data_offsets$"),
    "unknown dtype": (_set("net.w", "dtype", "F128"), "tensor net.w has unknown dtype 'F128'$"),
    "dtype not str": (_set("net.w", "dtype", ["F32"]), r"tensor net.w has unknown dtype \['F32'\]$"),
    "lone surrogate": (_raw(b'{"a\\ud800": {}}'), r"\(header: a lone surrogate escape in 'a\\ud800'\)"),
    "deep shape": (_set("net.w", "shape", [[[[[[1]]]]]]), r"shape \[\[\[\[...\]\]\]\] is not a list"),
    "negative size": (_set("net.w", "shape", [-4, -3]), r"tensor net.w: shape \[-4, -3\] is not a list"),
    "bool size": (_set("net.w", "shape", [True, 12]), r"tensor net.w: shape \[True, 12\] is not a list"),
    "float size": (_set("net.w", "shape", [4.0, 3]), r"tensor net.w: shape \[4.0, 3\] is not a list"),
    "shape not list": (_set("net.w", "shape", 12), "tensor net.w: shape 12 is not a list"),
    "rank 9": (_set("net.w", "shape", [1] * 9), "is not a list of at most 8"),
    "element count overflows": (_raw({"a": f32(0, 0, [2**40, 2**40, 0])}), r"tensor a: shape .* is too large"),
    "empty but too large": (_raw({"a": f32(0, 0, [0, 2**64])}), r"tensor a: shape \[0, 18446744073709551616\] is too"),
    "offsets reversed": (_set("net.w", "data_offsets", [68, 20]),
                         r"tensor net.w: data_offsets \[68, 20\] are reversed"),
    "offsets negative": (_set("net.w", "data_offsets", [-48, 0]), "are not two non-negative whole numbers"),
    "three offsets": (_set("net.w", "data_offsets", [20, 68, 70]), "are not two non-negative whole numbers"),
    "size mismatch": (_set("net.w", "data_offsets", [20, 60]),
                      r"tensor net.w: data_offsets \[20, 60\] hold 40 bytes, but F32 \[4, 3\] needs 48"),
    "overlap": (_raw({"a": f32(0, 8, [2]), "b": f32(4, 12, [2])}, bytes(12)),
                r"tensor b: data_offsets \[4, 12\] overlap tensor a"),
    "same bytes twice": (_raw({"a": f32(0, 8, [2]), "b": f32(0, 8, [2])}, bytes(8)), "overlap tensor a"),
    "gap": (_raw({"a": f32(0, 8, [2]), "b": f32(12, 20, [2])}, bytes(20)), "leave 4 bytes unused before it"),
    "past end of file": (_edit(lambda h: h["net.w"].update(shape=[4, 4], data_offsets=[20, 84])),
                         "is truncated: 16 bytes missing$"),
    "10^12 elements": (_raw({"a": f32(0, 4 * 10**12, [10**12])}, bytes(8)),
                       f"is truncated: {4 * 10**12 - 8} bytes missing$"),
    "trailing bytes": (_raw({"a": f32(0, 8, [2])}, bytes(12)), "4 bytes follow the last tensor"),
    "header longer than file": (_bytes(struct.pack("<Q", 1000) + b"{}"), r"header length 1000, but only 2 bytes"),
    "huge header length": (_bytes(struct.pack("<Q", 2**62) + b"{}"), "over the 100000000 byte limit"),
    "shorter than a length": (_bytes(b"\x05\x00"), r"truncated or not a safetensors file \(2 bytes\)"),
    "empty": (_bytes(b""), r"truncated or not a safetensors file \(0 bytes\)"),
}


@pytest.mark.parametrize("case", BAD_HEADERS)
def test_bad_header_is_one_line_naming_file_and_tensor(checkpoint, case):
    make, pattern = BAD_HEADERS[case]
    assert_refused(make(checkpoint), pattern)


@pytest.mark.parametrize("dtype, name", [(torch.int64, "I64"), (torch.bool, "BOOL"), (torch.uint8, "U8"),
                                         (torch.int32, "I32"), (torch.float8_e4m3fn, "F8_E4M3")])
def test_a_non_float_weight_is_refused_by_name(tmp_path, dtype, name):
    path = tmp_path / "ints.safetensors"
    save_tensors({"net.w": torch.ones(4, 3), "net.blocks.0.mlp.layer1.weight": torch.zeros(3, 2, dtype=dtype)}, path)
    assert_refused(path, rf"tensor net.blocks.0.mlp.layer1.weight has dtype {name}; "
                         "a floating-point weight is expected$")


def test_every_float_dtype_and_a_callers_own_choice(tmp_path):
    path = tmp_path / "mixed.safetensors"
    kinds = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
    save_tensors({name: torch.ones(2, dtype=dtype) for name, dtype in kinds.items()}, path)
    assert {k: t.dtype for k, t in load_tensors(path, "DiT").items()} == kinds
    save_tensors({"ids": torch.arange(3), "mask": torch.ones(3, dtype=torch.bool)}, path)
    found = read_header(path, "token", dtypes=DTYPE_BYTES)
    assert {k: i.dtype for k, i in found.tensors.items()} == {"ids": "I64", "mask": "BOOL"}
    assert read_shapes(path, "token", dtypes=("I64", "BOOL")) == {"ids": (3,), "mask": (3,)}
    assert torch.equal(load_tensors(path, "token", dtypes=DTYPE_BYTES)["ids"], torch.arange(3))
    with pytest.raises(AnimaError, match="tensor ids has dtype I64; BOOL is expected"):
        read_header(path, "token", dtypes=("BOOL",))


def test_odd_names_stay_on_one_line(tmp_path):
    path = write(tmp_path / "odd.safetensors", {"a\nb" + "x" * 500: f32(0, 4, [2])}, bytes(4))
    with pytest.raises(AnimaError, match=r"tensor 'a\\nbxx+\.\.\.: data_offsets") as caught:
        read_shapes(path, "DiT")
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_pickle_renamed_safetensors_is_never_unpickled(tmp_path, protocol):
    marker = tmp_path / "unpickled"
    path = tmp_path / "model.safetensors"
    path.write_bytes(planted_pickle(marker, protocol))
    # The plant is live: loading a copy aimed elsewhere does create its marker (here, on purpose, in the test).
    probe = tmp_path / "probe"
    pickle.loads(planted_pickle(probe, protocol))["state_dict"].close()
    assert probe.exists()
    readers = [*READERS, lambda p, _: read_dit_config(p), lambda p, _: load_dit(p),
               lambda p, _: trained_image_size(p), lambda p, _: read_vae_config(p), lambda p, _: load_vae(p),
               lambda p, _: load_text_encoder(p)]
    assert_refused(path, "is truncated or not a safetensors file", readers)
    assert not marker.exists()


def test_shape_checks_name_the_tensor():
    with pytest.raises(AnimaError, match="missing tensor b"):
        check_shapes({"a": (1,)}, {"a": (1,), "b": (2,)}, "X")
    with pytest.raises(AnimaError, match=r"tensor a has shape \[3\], expected \[1\]"):
        check_shapes({"a": (3,)}, {"a": (1,)}, "X")


def test_a_write_the_system_refuses_is_one_line_and_leaves_nothing(tmp_path):
    """safetensors reports a failed write (here the file size limit; a full disk alike, ENOSPC) as its own
    SafetensorError: it is one line naming the file, and no temporary or partial file is left."""
    resource = pytest.importorskip("resource")
    import signal

    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, limits[1]))  # the write fails with EFBIG past 64 KiB
    try:
        with pytest.raises(AnimaError, match=r"^cannot write .*big\.safetensors: File too large \(it needs about "
                                             r"264\.1 KiB; the file size limit is 64\.0 KiB\)$"):
            save_tensors({"a": torch.zeros(1 << 16)}, tmp_path / "big.safetensors")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert list(tmp_path.iterdir()) == []
