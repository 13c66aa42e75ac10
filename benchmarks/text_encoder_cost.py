"""What re-encoding a prompt on resume would cost: load a full-size (random) Qwen3-0.6B and encode two prompts.

    .venv/bin/python benchmarks/text_encoder_cost.py [--file /tmp/qwen3-full.safetensors]

Writes the 1.1 GiB random encoder once (kept for reruns), then times one load and the encoding of a 40- and a
20-token prompt on one thread, the file in the page cache. Resume states store the contexts instead (4 MiB).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from anima_rknn.demo.tiny_set import FULL_QWEN_VOCAB, TEXT_ENCODERS
from anima_rknn.text.encoder import load_text_encoder, write_random_text_encoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=Path("/tmp/qwen3-full.safetensors"))
    args = parser.parse_args()
    if not args.file.exists():
        write_random_text_encoder(args.file, hidden=1024, vocab=FULL_QWEN_VOCAB, seed=1, **TEXT_ENCODERS["full"])
    torch.set_num_threads(1)
    start = time.perf_counter()
    encoder = load_text_encoder(args.file)
    loaded = time.perf_counter() - start
    start = time.perf_counter()
    with torch.no_grad():
        for ids in ([1000 + i for i in range(40)], [2000 + i for i in range(20)]):
            encoder.encode(ids)
    encoded = time.perf_counter() - start
    print(f"{args.file.stat().st_size / 2**30:.2f} GiB: load {loaded:.2f} s, encode two prompts {encoded:.2f} s "
          "(one thread)")


if __name__ == "__main__":
    main()
