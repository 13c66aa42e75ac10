"""Prompt weights, expected values written down from ComfyUI's token_weights rules (see prompt.py)."""

import pytest

from anima_rknn.text.prompt import parse_prompt_weights


def assert_chunks(prompt: str, expected: list[tuple[str, float]]) -> None:
    got = parse_prompt_weights(prompt)
    assert [text for text, _ in got] == [text for text, _ in expected]
    assert [weight for _, weight in got] == pytest.approx([weight for _, weight in expected], rel=1e-12)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("a cat", [("a cat", 1.0)]),
        ("a (red:1.5) cat", [("a ", 1.0), ("red", 1.5), (" cat", 1.0)]),
        ("(cat)", [("cat", 1.1)]),
        ("(cat:0.5)", [("cat", 0.5)]),
        ("(cat: 1.25 )", [("cat", 1.25)]),  # float() allows surrounding spaces
        ("(a, b:2)", [("a, b", 2.0)]),
        ("(time:12:30:2)", [("time:12:30", 2.0)]),  # the LAST ':' decides
        ("(1girl:1.3), (white dress)", [("1girl", 1.3), (", ", 1.0), ("white dress", 1.1)]),
    ],
)
def test_plain_weights(prompt: str, expected: list[tuple[str, float]]) -> None:
    assert_chunks(prompt, expected)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("((a))", [("a", 1.1 * 1.1)]),
        ("(((a)))", [("a", 1.1**3)]),
        ("((a):1.5)", [("a", 1.5 * 1.1)]),  # explicit weight on the outer group, 1.1 for the inner one
        ("((a:1.5))", [("a", 1.5)]),  # an explicit weight replaces the surrounding weight
        ("((a:0.5):2)", [("a", 0.5)]),
        ("x ((a) b:1.5) y", [("x ", 1.0), ("a", 1.65), (" b", 1.5), (" y", 1.0)]),
        ("(a (b) c)", [("a ", 1.1), ("b", 1.21), (" c", 1.1)]),
        ("((a:2) b)", [("a", 2.0), (" b", 1.1)]),  # last ':' sits inside the inner group: no weight outside
    ],
)
def test_nesting(prompt: str, expected: list[tuple[str, float]]) -> None:
    assert_chunks(prompt, expected)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        (r"\(cat\)", [("(cat)", 1.0)]),
        (r"smile \(emoticon\), (red:1.2)", [("smile (emoticon), ", 1.0), ("red", 1.2)]),
        (r"(\(cat\):1.5)", [("(cat)", 1.5)]),
        (r"(a:1.5\))", [("a:1.5)", 1.1)]),  # an escaped ')' makes the weight suffix not a number
        ("back\\slash", [("back\\slash", 1.0)]),
        ("\\\\(a)", [("\\(a)", 1.0)]),  # "\\(" is a backslash then an escaped '(' ; the ')' is then unpaired
    ],
)
def test_escapes(prompt: str, expected: list[tuple[str, float]]) -> None:
    assert_chunks(prompt, expected)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("", []),
        ("()", []),
        ("a ()b", [("a b", 1.0)]),
        ("a (b", [("a (b", 1.0)]),
        ("a) (b)", [("a) ", 1.0), ("b", 1.1)]),
        ("((a)", [("(", 1.0), ("a", 1.1)]),
        ("(a))", [("a", 1.1), (")", 1.0)]),
        (")(", [(")(", 1.0)]),
        ("(:1.5)", [(":1.5", 1.1)]),  # ':' first in the group is text
        ("(a:b)", [("a:b", 1.1)]),
        ("(a:)", [("a:", 1.1)]),
        ("(a:inf)", [("a:inf", 1.1)]),
        ("(a:nan)", [("a:nan", 1.1)]),
        ("   ", [("   ", 1.0)]),
    ],
)
def test_malformed_never_raises(prompt: str, expected: list[tuple[str, float]]) -> None:
    assert_chunks(prompt, expected)


def test_equal_adjacent_weights_merge() -> None:
    assert parse_prompt_weights("x (a:0.5)(b:0.5) y") == [("x ", 1.0), ("ab", 0.5), (" y", 1.0)]
    assert parse_prompt_weights("(a:1.0) b") == [("a b", 1.0)]


def test_chunks_reassemble_unweighted_text() -> None:
    prompt = "score_9, (masterpiece:1.2), ((best quality)), (detailed:0.8) eyes, 1girl"
    assert "".join(chunk for chunk, _ in parse_prompt_weights(prompt)) == (
        "score_9, masterpiece, best quality, detailed eyes, 1girl"
    )


# ---- hostile prompts: the parser never raises anything but AnimaError, and weights stay finite ----------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from anima_rknn.errors import AnimaError  # noqa: E402
from anima_rknn.text.prompt import MAX_NESTING  # noqa: E402

# Mostly the characters the grammar cares about, so that deep, odd and unbalanced groups are common.
PROMPT_TEXT = st.text(alphabet=st.sampled_from("()(:\\\\)1.5e-nanif x,") | st.characters(), max_size=400)


@settings(max_examples=300, deadline=None)
@given(PROMPT_TEXT)
def test_any_prompt_parses_or_raises_anima_error(prompt):
    try:
        chunks = parse_prompt_weights(prompt)
    except AnimaError as e:
        assert "nest more than" in str(e)
        return
    assert all(chunk and isinstance(weight, float) and weight == weight and abs(weight) != float("inf")
               for chunk, weight in chunks)
    if not any(c in prompt for c in "()[]"):  # without groups the prompt is one chunk, untouched
        assert chunks == ([(prompt, 1.0)] if prompt else [])


@pytest.mark.parametrize("depth", [MAX_NESTING, MAX_NESTING + 1, 50_000])
def test_deep_nesting_is_bounded(depth):
    prompt = "(" * depth + "x" + ")" * depth
    if depth <= MAX_NESTING:
        assert parse_prompt_weights(prompt) == [("x", pytest.approx(1.1**depth))]
    else:
        with pytest.raises(AnimaError, match=f"nest more than {MAX_NESTING}"):
            parse_prompt_weights(prompt)


def test_unbalanced_deep_prompt_is_plain_text():
    """50,000 unmatched '(' are literal text: no recursion at all, no error."""
    assert parse_prompt_weights("(" * 50_000 + "x") == [("(" * 50_000 + "x", 1.0)]
