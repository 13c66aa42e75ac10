"""A1111's prompt editing: "[from:to:when]", "[to:when]", "[from::when]" and "[a|b]" change the prompt over the
steps, as WebUI's modules/prompt_parser.py schedules them (get_learned_conditioning_prompt_schedules, re-derived).

* "[from:to:when]" is `from` up to step `when`, then `to`; "[to:when]" has no `from`, "[from::when]" no `to`.
  `when` with a decimal point is a share of the steps ("0.25"), without one a step number ("5"). Groups nest;
  "(word:1.2)" weights and a bare "[word]" inside them are kept as text for the weight parser (text/prompt.py).
* "[a|b|c]" takes the options in turn, one a step (an option may be empty: "[fe|]male").
* A hires pass has its own schedule over its own steps; there a share runs from 1 to 2 ("1.5": half-way through the
  hires pass) and a step number counts on after the first pass's steps (WebUI's default, not its old scheduling).
* The schedule is WebUI's list of (last step, text); `text_at` picks a model call's text as WebUI's denoiser does
  (its counter starts at 0, so "[a:b:5]" is `a` for 6 calls). Two-call samplers count calls, as in WebUI.
* A backslash keeps the next character from being syntax; the escape stays in the text for the weight parser.

Local rules where WebUI is silent or odd: a "|" outside an alternation is text (in WebUI it turns all the prompt's
editing off); a "[" never closed or a "]" never opened next to editing syntax, a `when` below 0, past the run's
steps or not finite, an alternation of empty options only, groups nested over MAX_NESTING deep and more than
MAX_TEXTS distinct prompts are one AnimaError line each.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from ..errors import AnimaError
from .prompt import MAX_NESTING

MAX_TEXTS = 32  # distinct prompts one schedule may need encoded (each is a text-encoder pass)
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")  # lark's SIGNED_NUMBER, as WebUI's grammar
_HINT = re.compile(r":\s*[+-]?\.?\d|\|")  # what makes an unpaired bracket look like editing


@dataclass(frozen=True)
class _Edit:
    before: tuple[_Node, ...]
    after: tuple[_Node, ...]
    when: str  # as written: a decimal point makes it a share of the steps


@dataclass(frozen=True)
class _Alternate:
    options: tuple[tuple[_Node, ...], ...]


_Node = str | _Edit | _Alternate


class _Parser:
    """Recursive descent over WebUI's grammar. Inside a group everything must parse or the group fails (it is
    then text, as WebUI's stray brackets are); at the top level "(", ")" and ":" are text and only a paired "["
    starts a group. Group results are memoised by position, so a failed group costs its length once."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.partner = _pairs(text)
        self._groups: dict[tuple[int, bool], tuple[tuple[_Node, ...], int] | None] = {}

    def top(self) -> tuple[_Node, ...]:
        nodes: list[_Node] = []
        pos = 0
        while pos < len(self.text):
            char = self.text[pos]
            if char == "\\":
                nodes.append(self.text[pos:pos + 2])
                pos += 2
            elif char == "[" and pos in self.partner:
                group = self._group(pos, 0)
                if group is None:
                    nodes.append(char)
                    pos += 1
                else:
                    nodes.extend(group[0])
                    pos = group[1]
            else:
                nodes.append(char)
                pos += 1
        return _merged(nodes)

    def _group(self, pos: int, depth: int) -> tuple[tuple[_Node, ...], int] | None:
        """The group opening at `pos` ("[" or "(") and the position after it; None: it does not parse. A
        bracket group is read with "|" as a separator first, then with "|" as text."""
        if depth >= MAX_NESTING:
            raise AnimaError(f"prompt editing nests more than {MAX_NESTING} brackets deep")
        for pipes in (True, False):
            key = (pos, pipes)
            if key not in self._groups:
                self._groups[key] = (self._paren(pos, depth) if self.text[pos] == "(" else
                                     self._bracket(pos, depth, pipes))
            if self._groups[key] is not None or self.text[pos] == "(":
                return self._groups[key]
        return None

    def _prompt(self, pos: int, depth: int, pipes: bool) -> tuple[list[_Node], int] | None:
        """Text and groups up to the next ":", ")", "]" (or "|" when `pipes`) or the end."""
        nodes: list[_Node] = []
        while pos < len(self.text):
            char = self.text[pos]
            if char in ":)]" or (char == "|" and pipes):
                break
            if char == "\\":
                nodes.append(self.text[pos:pos + 2])
                pos += 2
            elif char in "[(":
                if pos not in self.partner:
                    return None
                group = self._group(pos, depth + 1)
                if group is None:
                    return None
                nodes.extend(group[0])
                pos = group[1]
            else:
                nodes.append(char)
                pos += 1
        return nodes, pos

    def _paren(self, pos: int, depth: int) -> tuple[tuple[_Node, ...], int] | None:
        """"(" prompt ")" or "(" prompt ":" prompt ")": kept whole as text for the weight parser."""
        first = self._prompt(pos + 1, depth, False)
        if first is None:
            return None
        nodes, at = ["(", *first[0]], first[1]
        if self.text[at:at + 1] == ":":
            second = self._prompt(at + 1, depth, False)
            if second is None:
                return None
            nodes, at = [*nodes, ":", *second[0]], second[1]
        return ((*nodes, ")"), at + 1) if self.text[at:at + 1] == ")" else None

    def _bracket(self, pos: int, depth: int, pipes: bool) -> tuple[tuple[_Node, ...], int] | None:
        first = self._prompt(pos + 1, depth, pipes)
        if first is None:
            return None
        nodes, at = first
        end = self.text[at:at + 1]
        if end == "]":  # a bare "[word]": text, the weight parser's to weigh
            return ("[", *nodes, "]"), at + 1
        if end == "|":
            return self._alternation(nodes, at, depth)
        if end != ":":
            return None
        when = self._when(at + 1)
        if when is not None:  # "[to:when]"
            return (_Edit((), _merged(nodes), when[0]),), when[1]
        second = self._prompt(at + 1, depth, pipes)
        if second is None or self.text[second[1]:second[1] + 1] != ":":
            return None
        when = self._when(second[1] + 1)
        if when is None:
            return None
        return (_Edit(_merged(nodes), _merged(second[0]), when[0]),), when[1]

    def _alternation(self, first: list[_Node], at: int, depth: int) -> tuple[tuple[_Node, ...], int] | None:
        options = [_merged(first)]
        while self.text[at:at + 1] == "|":
            option = self._prompt(at + 1, depth, True)
            if option is None:
                return None
            options.append(_merged(option[0]))
            at = option[1]
        if self.text[at:at + 1] != "]":
            return None
        return (_Alternate(tuple(options)),), at + 1

    def _when(self, pos: int) -> tuple[str, int] | None:
        """WHITESPACE? NUMBER WHITESPACE? "]": the number as written and the position after the "]"."""
        while pos < len(self.text) and self.text[pos].isspace():
            pos += 1
        number = _NUMBER.match(self.text, pos)
        if number is None:
            return None
        pos = number.end()
        while pos < len(self.text) and self.text[pos].isspace():
            pos += 1
        return (number.group(), pos + 1) if self.text[pos:pos + 1] == "]" else None


def _structural(text: str) -> Iterator[tuple[int, str]]:
    """The unescaped brackets and parentheses of `text`, with their positions."""
    pos = 0
    while pos < len(text):
        if text[pos] == "\\":
            pos += 2
            continue
        if text[pos] in "[]()":
            yield pos, text[pos]
        pos += 1


def _pairs(text: str) -> dict[int, int]:
    """Every unescaped bracket and parenthesis with a partner, each kind paired on its own, both ways."""
    pairs: dict[int, int] = {}
    stacks: dict[str, list[int]] = {"[": [], "(": []}
    for pos, char in _structural(text):
        if char in stacks:
            stacks[char].append(pos)
        else:
            stack = stacks["[" if char == "]" else "("]
            if stack:
                pairs[stack[-1]], pairs[pos] = pos, stack[-1]
                stack.pop()
    return pairs


def _check_closed(text: str, partner: dict[int, int]) -> None:
    """A "[" never closed (or a "]" never opened) beside editing syntax is a mistake, not text."""
    brackets = [pos for pos, char in _structural(text) if char in "[]"]
    for index, pos in enumerate(brackets):
        if pos in partner:
            continue
        if text[pos] == "[":
            stop = brackets[index + 1] if index + 1 < len(brackets) else len(text)
            if _HINT.search(text, pos + 1, stop):
                raise AnimaError(f"the '[' at character {pos + 1} is never closed: prompt editing is "
                                 "[from:to:when] or [a|b] (write \\[ for the character)")
        else:
            begin = brackets[index - 1] + 1 if index else 0
            if _HINT.search(text, begin, pos):
                raise AnimaError(f"the ']' at character {pos + 1} closes no '[': prompt editing is "
                                 "[from:to:when] or [a|b] (write \\] for the character)")


def _merged(nodes: list[_Node] | tuple[_Node, ...]) -> tuple[_Node, ...]:
    out: list[_Node] = []
    for node in nodes:
        if isinstance(node, str) and out and isinstance(out[-1], str):
            out[-1] += node
        elif node != "":
            out.append(node)
    return tuple(out)


def _walk(nodes: tuple[_Node, ...]) -> Iterator[_Edit | _Alternate]:
    for node in nodes:
        if isinstance(node, _Edit):
            yield node
            yield from _walk(node.before)
            yield from _walk(node.after)
        elif isinstance(node, _Alternate):
            yield node
            for option in node.options:
                yield from _walk(option)


@dataclass(frozen=True)
class EditedPrompt:
    """A prompt parsed for editing. `edits` is False for a prompt without any: its one text is the prompt."""

    text: str
    nodes: tuple[_Node, ...]

    @cached_property
    def edits(self) -> bool:
        return any(not isinstance(node, str) for node in self.nodes)

    def check(self, steps: int, hires_steps: int | None = None) -> None:
        """Every `when` fits a run of `steps` steps (then `hires_steps` in a hires pass), in WebUI's units."""
        for node in _walk(self.nodes):
            if isinstance(node, _Alternate):
                if not any(node.options):
                    raise AnimaError("an alternation [a|b] needs at least one option that is not empty")
                continue
            value = float(node.when)
            share = "." in node.when
            top = (2.0 if hires_steps else 1.0) if share else float(steps + (hires_steps or 0))
            if not (math.isfinite(value) and 0 <= value <= top):
                unit = ("a share of the steps from 0 to " + ("2 (1 to 2: the hires pass)" if hires_steps else "1")
                        if share else f"a step from 0 to {int(top)}")
                raise AnimaError(f"prompt editing [..:{node.when}]: the 'when' must be {unit}")

    def schedule(self, steps: int, base_steps: int | None = None) -> list[tuple[int, str]]:
        """WebUI's schedule: (last step, text) pairs in step order, the last at `steps`. `base_steps`: this is a
        hires pass of `steps` after a first pass of `base_steps`. Call check() first."""
        whens = {node: _step(node.when, steps, base_steps) for node in _walk(self.nodes) if isinstance(node, _Edit)}
        ends = {steps} | {when for when in whens.values() if when >= 1}
        if any(isinstance(node, _Alternate) for node in _walk(self.nodes)):
            ends |= set(range(1, steps + 1))
        schedule = [(end, _render(self.nodes, end, whens)) for end in sorted(ends)]
        if len({text for _, text in schedule}) > MAX_TEXTS:
            raise AnimaError(f"prompt editing makes more than {MAX_TEXTS} different prompts in one pass")
        return schedule


def _step(when: str, steps: int, base_steps: int | None) -> int:
    """WebUI's step of a `when` in a pass of `steps` (a hires pass after `base_steps` when given)."""
    value = float(when)
    if "." in when:
        value = (value - (1.0 if base_steps is not None else 0.0)) * steps
    else:
        value -= base_steps or 0
    return min(steps, int(value))


def _render(nodes: tuple[_Node, ...], step: int, whens: dict[_Edit, int]) -> str:
    parts: list[str] = []
    for node in nodes:
        if isinstance(node, str):
            parts.append(node)
        elif isinstance(node, _Edit):
            parts.append(_render(node.before if step <= whens[node] else node.after, step, whens))
        else:
            parts.append(_render(node.options[(step - 1) % len(node.options)], step, whens))
    return "".join(parts)


def parse_prompt_edits(text: str) -> EditedPrompt:
    """The prompt parsed for editing; a prompt without "[" is all text at once."""
    if "[" not in text and "]" not in text:
        return EditedPrompt(text, (text,) if text else ())
    parser = _Parser(text)
    _check_closed(text, parser.partner)
    return EditedPrompt(text, parser.top())


def text_at(schedule: list[tuple[int, str]], call: int) -> str:
    """The text WebUI's denoiser uses at its counter `call` (0 for the first model call of a pass): the first entry
    whose last step is not below it."""
    return next((text for end, text in schedule if call <= end), schedule[-1][1])
