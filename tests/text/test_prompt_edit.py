"""A1111 prompt editing (text/prompt_edit.py) against WebUI's own reference: the doctests of
modules/prompt_parser.py's get_learned_conditioning_prompt_schedules, transcribed as vectors (WebUI commit 28bd8e1),
WebUI's denoiser counter (reconstruct_cond_batch: the first entry whose last step is not below the counter), and
the bad input that is refused in one line."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anima_rknn.errors import AnimaError
from anima_rknn.text.prompt import MAX_NESTING, parse_prompt_weights
from anima_rknn.text.prompt_edit import MAX_TEXTS, parse_prompt_edits, text_at


def schedule(prompt: str, steps: int = 10, base_steps: int | None = None) -> list[list]:
    return [list(entry) for entry in parse_prompt_edits(prompt).schedule(steps, base_steps)]


def alternating(first: str, second: str, period: int = 2) -> list[list]:
    return [[step, first if step % period == 1 else second] for step in range(1, 11)]


# WebUI's doctests, 10 steps (g = get_learned_conditioning_prompt_schedules([p], 10)[0]).
WEBUI_VECTORS = [
    ("test", [[10, "test"]]),
    ("a [b:3]", [[3, "a "], [10, "a b"]]),
    ("a [b: 3]", [[3, "a "], [10, "a b"]]),
    ("a [[[b]]:2]", [[2, "a "], [10, "a [[b]]"]]),
    ("[(a:2):3]", [[3, ""], [10, "(a:2)"]]),
    ("a [b : c : 1] d", [[1, "a b  d"], [10, "a  c  d"]]),
    ("a[b:[c:d:2]:1]e", [[1, "abe"], [2, "ace"], [10, "ade"]]),
    ("a [unbalanced", [[10, "a [unbalanced"]]),
    ("a [b:.5] c", [[5, "a  c"], [10, "a b c"]]),
    ("a [{b|d{:.5] c", [[5, "a  c"], [10, "a {b|d{ c"]]),
    ("((a][:b:c [d:3]", [[3, "((a][:b:c "], [10, "((a][:b:c d"]]),
    ("[a|(b:1.1)]", alternating("a", "(b:1.1)")),
    ("[fe|]male", alternating("female", "male")),
    ("[fe|||]male", alternating("female", "male", 4)),
]


@pytest.mark.parametrize("prompt, expected", WEBUI_VECTORS)
def test_webui_schedules(prompt, expected):
    assert schedule(prompt) == expected


@pytest.mark.parametrize("prompt, expected", [
    # WebUI's hires doctests (g = get_learned_conditioning_prompt_schedules([p], 10, 10)[0]): in the hires pass a
    # share runs from 1 to 2 and a step number counts on after the first pass's 10 steps
    ("a [b:.5] c", [[10, "a b c"]]),
    ("a [b:1.5] c", [[5, "a  c"], [10, "a b c"]]),
    ("a [b:15] c", [[5, "a  c"], [10, "a b c"]]),
    ("a [b:5] c", [[10, "a b c"]]),
])
def test_webui_hires_schedules(prompt, expected):
    assert schedule(prompt, 10, base_steps=10) == expected


def test_the_first_pass_of_a_hires_run_keeps_a_later_switch_for_the_hires_pass():
    assert schedule("a [b:1.5] c") == [[10, "a  c"]] and schedule("a [b:15] c") == [[10, "a  c"]]


def test_the_example_of_webuis_comment():
    prompt = ("fantasy landscape with a [mountain:lake:0.25] and [an oak:a christmas tree:0.75][ in foreground::0.6]"
              "[ in background:0.25] [shoddy:masterful:0.5]")
    assert schedule(prompt, 100) == [
        [25, "fantasy landscape with a mountain and an oak in foreground shoddy"],
        [50, "fantasy landscape with a lake and an oak in foreground in background shoddy"],
        [60, "fantasy landscape with a lake and an oak in foreground in background masterful"],
        [75, "fantasy landscape with a lake and an oak in background masterful"],
        [100, "fantasy landscape with a lake and a christmas tree in background masterful"]]


def test_calls_pick_their_text_with_webuis_counter():
    """WebUI's denoiser counts its calls from 0 and takes the first entry whose last step is not below: a switch
    "at step 3" of 10 is the 5th call, and an alternation's first option runs twice."""
    edit = schedule("[a:b:3]")
    assert [text_at(edit, call) for call in range(10)] == ["a"] * 4 + ["b"] * 6
    alternation = schedule("[a|b]")
    assert [text_at(alternation, call) for call in range(6)] == ["a", "a", "b", "a", "b", "a"]


@pytest.mark.parametrize("prompt", ["a cat", "(a cat:1.2), [red] dog", "[a cat]", "(x)[y]", "a\\[b:c:0.5\\]", ""])
def test_prompts_without_editing_are_one_text(prompt):
    edited = parse_prompt_edits(prompt)
    assert not edited.edits and edited.schedule(20) == [(20, prompt)]


def test_escaped_brackets_are_text_and_stay_escaped_for_the_weight_parser():
    assert schedule("a \\[b:c:0.5\\] [d:e:0.5]") == [[5, "a \\[b:c:0.5\\] d"], [10, "a \\[b:c:0.5\\] e"]]
    assert parse_prompt_weights("a \\[b\\]") == [("a [b]", 1.0)]


def test_a_bare_bracket_divides_the_weight_by_1_1():
    """Our rule for A1111's "[word]" (WebUI's parse_prompt_attention): weight / 1.1, nested ones compound."""
    assert parse_prompt_weights("a [b] [[c]]") == [("a ", 1.0), ("b", pytest.approx(1 / 1.1)), (" ", 1.0),
                                                   ("c", pytest.approx(1 / 1.21))]
    assert parse_prompt_weights("([b])") == [("b", pytest.approx(1.0))]


def test_editing_keeps_comfyui_weights_inside():
    assert schedule("[(red:1.3):(blue:0.8):0.5] cat") == [[5, "(red:1.3) cat"], [10, "(blue:0.8) cat"]]
    assert schedule("((big [cat:dog:2]):1.2)") == [[2, "((big cat):1.2)"], [10, "((big dog):1.2)"]]


def test_a_pipe_outside_an_alternation_is_text():
    """Our rule: WebUI's grammar fails the whole prompt on a stray "|" and then edits nothing."""
    assert schedule("a|b [c:d:0.5]") == [[5, "a|b c"], [10, "a|b d"]]


# ---- bad input: one AnimaError line each ------------------------------------------------------------------------

@pytest.mark.parametrize("prompt, words", [
    ("a [b:c:0.5", "never closed"),
    ("a [b|c", "never closed"),
    ("a b:c:0.5] d", "closes no"),
    ("[a:b:0.5 and [c|d]", "never closed"),
])
def test_editing_that_does_not_close_is_refused(prompt, words):
    with pytest.raises(AnimaError, match=words):
        parse_prompt_edits(prompt)


@pytest.mark.parametrize("prompt, hires, words", [
    ("[a:b:1.5]", None, "share of the steps from 0 to 1"),
    ("[a:b:2.5]", 10, "from 0 to 2"),
    ("[a:b:-0.5]", None, "share of the steps"),
    ("[a:b:21]", None, "a step from 0 to 20"),
    ("[a:b:31]", 10, "a step from 0 to 30"),
    ("[a:b:-1]", None, "a step from 0 to 20"),
    ("[a:b:1e999]", None, "a step from 0"),
    ("[|]", None, "at least one option"),
    ("x [||] y", None, "at least one option"),
])
def test_a_when_outside_the_run_or_an_empty_alternation_is_refused(prompt, hires, words):
    with pytest.raises(AnimaError, match=words):
        parse_prompt_edits(prompt).check(20, hires)


@pytest.mark.parametrize("prompt", ["[a:b:0]", "[a:b:1.0]", "[a:b:20]", "[a:b:0.0]"])
def test_the_ends_of_the_range_are_taken(prompt):
    parse_prompt_edits(prompt).check(20)


def test_too_many_prompts_in_a_pass_is_refused():
    options = "|".join(f"w{i}" for i in range(MAX_TEXTS + 1))
    with pytest.raises(AnimaError, match=f"more than {MAX_TEXTS} different prompts"):
        parse_prompt_edits(f"[{options}]").schedule(MAX_TEXTS + 1)
    parse_prompt_edits(f"[{options}]").schedule(MAX_TEXTS)  # what the run's steps never reach is not encoded


@pytest.mark.parametrize("depth", [MAX_NESTING, MAX_NESTING + 1, 20_000])
def test_deep_editing_is_bounded(depth):
    prompt = "[a:" * depth + "x" + ":1]" * depth
    if depth <= MAX_NESTING:
        assert parse_prompt_edits(prompt).edits
    else:
        with pytest.raises(AnimaError, match=f"nests more than {MAX_NESTING}"):
            parse_prompt_edits(prompt)


@pytest.mark.parametrize("prompt", ["[" * 20_000 + "x", "]" * 20_000, "[x" * 10_000, "[a:(" * 5_000,
                                    "[(x)]" * 4_000, "[a|b]" * 4_000, "\\[" * 10_000, "[a" + ":b" * 10_000 + "]"])
def test_huge_prompts_parse_in_bounded_time(prompt):
    began = time.perf_counter()
    try:
        parse_prompt_edits(prompt)
    except AnimaError:
        pass
    assert time.perf_counter() - began < 2.0


EDIT_TEXT = st.text(alphabet=st.sampled_from("[]()|:\\ ab0.5-1e9") | st.characters(), max_size=300)


@settings(max_examples=300, deadline=None)
@given(EDIT_TEXT, st.integers(1, 60), st.sampled_from([None, 7]))
def test_any_prompt_edits_or_raises_anima_error(prompt, steps, hires):
    try:
        edited = parse_prompt_edits(prompt)
        edited.check(steps, hires)
        entries = edited.schedule(steps)
    except AnimaError as e:
        assert "\n" not in str(e)
        return
    assert [end for end, _ in entries] == sorted({end for end, _ in entries}) and entries[-1][0] == steps
    assert edited.edits or entries == [(steps, prompt)]
