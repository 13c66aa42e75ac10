"""docs/gguf.md's "From a GGUF download to an image", walked on the demo model: its folder layout filled with the
demo's files (the DiT quantized to Q8_0 by `anima-rknn quantize`, as the page's download would be), then its CPU
command and its export-onnx command run as the page writes them, at the demo's size."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from anima_rknn.cli import main
from anima_rknn.export.onnx import load_manifest
from anima_rknn.model.model_set import DEMO_MODEL
from doc_pages import ROOT, command_lines

PAGE = ROOT / "docs" / "gguf.md"
SECTION = "## From a GGUF download to an image"
DEMO_SIZE = ["-W", "64", "-H", "64"]  # the demo model's; click takes an option's last value
# What stands in for each downloaded file, by the folder the page puts it in.
DEMO_PARTS = {
    "split_files/text_encoders": DEMO_MODEL / "split_files" / "text_encoders" / "qwen3-demo-random.safetensors",
    "split_files/vae": DEMO_MODEL / "split_files" / "vae" / "wan-vae-demo.safetensors",
    "tokenizers/qwen3": DEMO_MODEL / "tokenizers" / "qwen3" / "tokenizer.json",
    "tokenizers/t5": DEMO_MODEL / "tokenizers" / "t5" / "tokenizer.json",
}


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:] if end < 0 else text[start:end]


def _run(monkeypatch, capsys, words: list[str]) -> str:
    monkeypatch.setattr(sys, "argv", ["anima-rknn", *words])
    try:
        main()
    except SystemExit as e:  # main exits only on an error
        pytest.fail(f"anima-rknn {' '.join(words)}: exit {e.code}: {capsys.readouterr().err}")
    return capsys.readouterr().out


def test_the_page_from_a_gguf_download_to_an_image(tmp_path, monkeypatch, capsys):
    section = _section()
    layout = [Path(line.strip()) for line in section.splitlines() if line.strip().startswith("anima/")]
    assert len(layout) == 5 and layout[0].suffix == ".gguf"
    monkeypatch.chdir(tmp_path)
    for path in layout:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".gguf":  # the download: the demo DiT in Q8_0
            source = DEMO_MODEL / "split_files" / "diffusion_models" / "anima-demo.safetensors"
            _run(monkeypatch, capsys, ["quantize", str(source), "-o", str(path), "--type", "q8_0"])
        else:
            shutil.copy(DEMO_PARTS[path.parent.relative_to("anima").as_posix()], path)
    commands = [words for _, words in command_lines(section)]
    cpu = next(w for w in commands if w[0] == "generate" and "--model" in w and "--backend" not in w)
    export = next(w for w in commands if w[0] == "export-onnx")
    _run(monkeypatch, capsys, [*cpu, *DEMO_SIZE, "--steps", "2"])
    picture = tmp_path / cpu[cpu.index("--out") + 1]
    assert picture.stat().st_size > 0
    _run(monkeypatch, capsys, [*export, *DEMO_SIZE])
    # the set fits the GGUF it came from (its fingerprint), at the demo's size
    manifest = load_manifest(tmp_path / export[export.index("--out") + 1], dit_path=tmp_path / layout[0], width=64,
                             height=64)
    assert manifest["dtype"] == "float16" and len(manifest["subgraphs"]) == 18
