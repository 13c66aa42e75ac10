"""Prompt editing in a run (text/prompt_edit.py): the text each model call of each pass is conditioned on, for the
prompt and the negative prompt, checked before any model loads; and the pass's step cache, cut into parts where
the conditioning changes (sampling/cache_segments.py) so that no forecast crosses a change.

A pass is described in WebUI's units (EditPass): its schedule's steps are the steps the pass runs times the model
calls a step makes (2 for heun and the like, as WebUI counts its second-order samplers), and its calls are numbered
from the first it runs, as WebUI's denoiser counts them. WebUI's hires pass runs all its steps, so its schedule is
over them; an img2img pass here too is scheduled over the steps it runs (WebUI's default img2img schedules over all
the steps but runs fewer, so that a late change never comes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import AnimaError
from ..sampling.cache_fit import CacheFit
from ..sampling.cache_seam import CachePolicy
from ..sampling.cache_segments import SegmentedCache, part_options
from ..sampling.caches import make_cache
from ..text.prompt import parse_prompt_weights
from ..text.prompt_edit import parse_prompt_edits, text_at

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class EditPass:
    steps: int  # the schedule's steps: the steps the pass runs x the model calls a step makes
    calls: int  # the model calls the pass makes
    base_steps: int | None = None  # a hires pass: the first pass's steps, in the same units


# Per pass, the text of every model call: (prompt texts, negative prompt texts).
CallTexts = list[tuple[list[str], list[str]]]


def call_texts(prompt: str, negative: str, passes: list[EditPass]) -> CallTexts | None:
    """The text of each model call of each pass, for both prompts; None when neither prompt edits (a run of one
    conditioning, exactly as before prompt editing existed). Raises AnimaError for bad editing, naming the prompt."""
    sides = []
    for name, text in (("prompt", prompt), ("negative prompt", negative)):
        try:
            edited = parse_prompt_edits(text)
            hires = passes[-1].steps if len(passes) > 1 else None
            edited.check(passes[0].steps, hires)
            sides.append(None if not edited.edits else
                         [edited.schedule(p.steps, p.base_steps) for p in passes])
        except AnimaError as e:
            raise AnimaError(f"the {name}: {e}") from None
    if sides == [None, None]:
        return None
    per_pass = []
    for index, edit_pass in enumerate(passes):
        texts = [[text_at(schedules[index], call) for call in range(edit_pass.calls)] if schedules is not None
                 else [plain] * edit_pass.calls for schedules, plain in zip(sides, (prompt, negative))]
        per_pass.append((texts[0], texts[1]))
    return per_pass


def check_edits(per_pass: CallTexts | None) -> None:
    """Every text call_texts() made within the weight parser's bounds: before any model loads."""
    for text in distinct_texts(per_pass or []):
        parse_prompt_weights(text)


def distinct_texts(per_pass: CallTexts) -> list[str]:
    """Every text the run encodes, once each, in the order of first use (the first call's prompt first)."""
    return list(dict.fromkeys(text for positive, negative in per_pass for call in zip(positive, negative)
                              for text in call))


def changes(positive: list[str], negative: list[str]) -> list[int]:
    """The 1-based calls whose conditioning differs from the call before."""
    return [call for call in range(2, len(positive) + 1)
            if (positive[call - 1], negative[call - 1]) != (positive[call - 2], negative[call - 2])]


def pass_cache(name: str, calls: int, options: dict, fit: CacheFit | None,
               starts: list[int] | None = None) -> CachePolicy:
    """The pass's step cache (sampling.caches.make_cache); where the conditioning changes at `starts`, one that
    begins afresh at each (a cache that forecasts nothing needs no cutting)."""
    if not starts or name == "none":
        return make_cache(name, calls, options, fit)
    return SegmentedCache(lambda part: make_cache(name, part, part_options(options, part, calls), fit), calls,
                          starts)


def pass_starts(per_pass: CallTexts | None, index: int) -> list[int] | None:
    """Where pass `index`'s conditioning changes (None: a run without editing)."""
    return None if per_pass is None else changes(*per_pass[index])


class CallConditioning:
    """One pass's contexts per model call, both prompts, from the encoded texts: the sampling loop tells it each
    call's number (sample's on_call) and the denoiser asks for that call's pair."""

    def __init__(self, positive: list[str], negative: list[str], by_text: dict[str, torch.Tensor]) -> None:
        self.positive = [by_text[text] for text in positive]
        self.negative = [by_text[text] for text in negative]
        self.starts = changes(positive, negative)
        self.call = 1

    def at(self, call: int) -> None:
        self.call = call

    def now(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.positive[self.call - 1], self.negative[self.call - 1]

    def contexts(self, sides: int) -> list[torch.Tensor]:
        """The pass's distinct contexts, of the prompt alone (sides 1: CFG 1) or of both."""
        return list({id(c): c for c in [*self.positive, *self.negative][: len(self.positive) * sides]}.values())
