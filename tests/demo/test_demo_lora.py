"""The shipped demo LoRA (anima_rknn/demo_model/loras/large-shapes.safetensors): a small kohya file the loader
takes, a concept word the demo tokenizers know, a reader that sees the concept on true pictures, and the LoRA
making the demo model draw what it could not before."""

from __future__ import annotations

import json

import numpy as np
import torch

from anima_rknn.core.tensorfile import read_metadata
from anima_rknn.demo import DEMO_MODEL, dataset, demo_model_dir
from anima_rknn.demo.evaluate import adherence, generate_images, judge, prompt_set, read_image
from anima_rknn.generation.pipeline import AnimaPipeline
from anima_rknn.model.io import read_dit_config
from anima_rknn.model.lora import LoraRef, open_lora
from anima_rknn.model.model_set import from_model_dir
from anima_rknn.text import PromptTokenizer

SHIPPED = DEMO_MODEL / "loras" / "large-shapes.safetensors"
# Measured on 6 large-shape prompts of the eval set (20 steps, CFG 4, seeds 1000..): size right 0/6 without the
# LoRA, 6/6 with it. The bounds leave a margin of two prompts.
MAX_SIZE_WITHOUT, MIN_SIZE_WITH = 2 / 6, 4 / 6
E2E_PROMPTS = 6


def test_shipped_lora_is_a_small_kohya_file_for_the_demo_model() -> None:
    assert SHIPPED.stat().st_size < 2 * 1024 * 1024
    lora = open_lora(LoraRef(SHIPPED), read_dit_config(from_model_dir(demo_model_dir()).dit))
    assert lora.layout == "kohya" and len(lora.layers) > 60
    assert any(name.startswith("llm_adapter.") for name in lora.layers)
    meta = read_metadata(SHIPPED, "LoRA")
    assert meta["anima_rknn.demo.lora.concept"] == dataset.LARGE
    assert json.loads(meta["anima_rknn.demo.lora.training"])["steps"] > 100


def test_the_concept_word_is_known_to_the_demo_tokenizers_but_in_no_base_caption() -> None:
    files = from_model_dir(demo_model_dir())
    tokenizer = PromptTokenizer.from_dirs(files.qwen_tokenizer, files.t5_tokenizer)
    assert dataset.LARGE in tokenizer.qwen.get_vocab() and dataset.LARGE in tokenizer.t5.get_vocab()
    assert not any(dataset.LARGE in s.caption for s in dataset.combinations("all"))
    assert all(s.large and dataset.LARGE in s.caption for s in dataset.combinations(dataset.LARGE))


def test_reader_sees_large_shapes_on_true_pictures() -> None:
    images, specs = dataset.batch(11, 0, 150, dataset.LARGE)
    assert adherence(judge(specs, images))["all"] == 1.0
    largest = dataset.ShapeSpec("square", "red", "blue", "center", half_size=dataset.HALF_SIZE_RANGE[1])
    assert read_image(dataset.render(largest)).large is False


def test_prompt_set_with_the_concept_is_fixed_and_half_large() -> None:
    specs = prompt_set(24, concept=dataset.LARGE)
    assert specs == prompt_set(24, concept=dataset.LARGE) and len(set(specs)) == 24
    assert [s.large for s in specs] == [False, True] * 12
    assert [s for s in specs if not s.large] == prompt_set(12)  # the base prompts are the plain set's


def test_shipped_lora_makes_the_demo_model_draw_large_shapes() -> None:
    torch.set_num_threads(1)
    specs = [s for s in prompt_set(2 * E2E_PROMPTS, concept=dataset.LARGE) if s.large]
    pipeline = AnimaPipeline(from_model_dir(demo_model_dir()), keep_dit=True)
    size = {}
    for name, loras in (("without", []), ("with", [LoraRef(SHIPPED)])):
        judged = judge(specs, generate_images(demo_model_dir(), specs, loras=loras, pipeline=pipeline))
        size[name] = float(np.mean([j.hits["size"] for j in judged]))
    assert size["without"] <= MAX_SIZE_WITHOUT and size["with"] >= MIN_SIZE_WITH, size
