"""Text conditioning inputs: prompt weights, Qwen3/T5 tokenisation and the Qwen3 text encoder."""

from .encoder import TextEncoder, load_text_encoder, qwen3_config_from_shapes, write_random_text_encoder
from .prompt import parse_prompt_weights
from .tokenizers import PromptTokenizer, TokenizedPrompt, build_word_tokenizers

__all__ = [
    "PromptTokenizer",
    "TextEncoder",
    "TokenizedPrompt",
    "build_word_tokenizers",
    "load_text_encoder",
    "parse_prompt_weights",
    "qwen3_config_from_shapes",
    "write_random_text_encoder",
]
