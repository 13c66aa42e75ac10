"""What the documentation tests read: the pages (README.md and docs/**/*.md), their links and anchors as GitHub
renders them, and the `anima-rknn ...` command lines they show, parsed against the real click CLI."""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import click

from anima_rknn.errors import AnimaError
from anima_rknn.generation.params import options as setting_options
from anima_rknn.sampling.caches import CACHE_NAMES

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the target up to the first space or ')' (a title after it is ignored).
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
# A shell word naming the console script: anima-rknn, .venv-rknn/bin/anima-rknn, ~/anima-venv/bin/anima-rknn.
_PROGRAM = re.compile(r"^(?:\S*/)?anima-rknn$")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")


def pages(root: Path = ROOT) -> list[Path]:
    """README.md, CHANGELOG.md and every Markdown page under docs/."""
    changelog = [root / "CHANGELOG.md"] if (root / "CHANGELOG.md").exists() else []
    return [root / "README.md", *changelog, *sorted((root / "docs").rglob("*.md"))]


def split_code(text: str) -> tuple[list[str], list[tuple[int, str]]]:
    """The page's lines with fenced code blanked (line numbers kept), and each fenced line as (number, text)."""
    prose, code = [], []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            prose.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            else:
                code.append((number, line))
            prose.append("")
        else:
            prose.append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lower-cased, punctuation but '-' and '_' dropped, each
    space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*\*|__|\*)", "", text)
    text = "".join(c for c in text.lower() if c in "-_ " or unicodedata.category(c)[0] in "LNM")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the page's headings (and <a name/id> tags) give, with GitHub's -1, -2 for repeats."""
    seen: dict[str, int] = {}
    found = set()
    prose, _ = split_code(text)
    for line in prose:
        found.update(_HTML_ID.findall(line))
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_problems(root: Path = ROOT, files: list[Path] | None = None) -> list[str]:
    """'page:line: ...' for every relative link whose file does not exist or whose #anchor its page lacks."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for page in pages(root) if files is None else files:
        text = page.read_text(encoding="utf-8")
        prose, _ = split_code(text)
        for number, line in enumerate(prose, 1):
            for target in _LINK.findall(_INLINE_CODE.sub("", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                    continue  # http:, https:, mailto:
                path_part, _, anchor = target.partition("#")
                where = f"{page.relative_to(root)}:{number}"
                linked = (page.parent / unquote(path_part)).resolve() if path_part else page
                if not linked.exists():
                    problems.append(f"{where}: no such file: {target}")
                    continue
                if not anchor:
                    continue
                if linked.suffix != ".md":
                    problems.append(f"{where}: an anchor into a file that is not Markdown: {target}")
                    continue
                if linked not in cache:
                    cache[linked] = anchors(linked.read_text(encoding="utf-8"))
                if unquote(anchor) not in cache[linked]:
                    problems.append(f"{where}: {linked.relative_to(root)} has no heading for #{anchor}")
    return problems


def command_lines(text: str) -> list[tuple[int, list[str]]]:
    """(line, the words after the program) of every `anima-rknn ...` command the page shows: each line of a fenced
    block that runs the console script (with its '\\' continuations, without its '#' comment, after any VAR=value
    prefix), and each inline code span that starts with 'anima-rknn '."""
    prose, code = split_code(text)
    found = []
    joined: list[tuple[int, str]] = []
    for number, line in code:
        if joined and joined[-1][1].endswith("\\"):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
        else:
            joined.append((number, line.strip()))
    for number, line in joined:
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # not shell (JSON, Python)
        while words and _ENV_ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words and _PROGRAM.match(words[0]):
            found.append((number, words[1:]))
    offsets = [0]
    for line in prose:
        offsets.append(offsets[-1] + len(line) + 1)
    flat = "\n".join(prose)
    for match in _INLINE_CODE.finditer(flat):
        span = " ".join(match.group(2).split())
        if span.startswith("anima-rknn "):
            number = next(n for n, start in enumerate(offsets) if start > match.start())
            found.append((number, shlex.split(span)[1:]))
    return found


def _loose(words: list[str]) -> list[str]:
    """A synopsis's optional parts taken as given: '[--json]' -> '--json', '[--min-cosine' '0.999]' -> both."""
    words = [w[1:] if w.startswith("[-") else w for w in words]
    return [w[:-1] if w.endswith("]") and "[" not in w else w for w in words]


def _known_cache(name: str) -> str:
    if name not in CACHE_NAMES:
        raise AnimaError(f"unknown cache {name!r}; choose one of {', '.join(CACHE_NAMES)}")
    return name


def _spelling_checks() -> dict[str, Callable[[str], object]]:
    """The choices click takes as plain text (a setting with other spellings, such as A1111's sampler names, is
    parsed when the settings are built), by click parameter name: each raises AnimaError on a bad value."""
    checks: dict[str, Callable[[str], object]] = {name: opt.parse for name, opt in setting_options()
                                                  if opt.parse is not None}
    checks["samplers"] = lambda text: [checks["sampler"](one) for one in text.split(",")]  # bench's comma lists
    checks["caches"] = lambda text: [_known_cache(one) for one in text.split(",")]
    return checks


def command_problems(group: click.Group, words: list[str]) -> list[str]:
    """What is wrong with `anima-rknn WORDS` for the real CLI, parsed by click without running: an unknown
    command, an option the command lacks, a missing option value, a stray argument, a value outside a Choice (or
    outside the spellings a setting parses itself: sampler, scheduler, bench's comma lists). Values are not
    converted otherwise, so placeholders (DIR, FILE, N) pass."""
    words = _loose(words)
    if not words:
        return ["no command"]
    if words[0] in ("--help", "-h", "--version"):
        return []
    command = group.get_command(click.Context(group), words[0])
    if command is None:
        return [f"no such command: {words[0]}"]
    context = click.Context(command, info_name=words[0], resilient_parsing=False)
    parser = command.make_parser(context)
    try:
        values, extra, order = parser.parse_args(words[1:])
    except click.UsageError as e:
        return [f"{words[0]}: {e.format_message()}"]
    problems = []
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    if extra and not any(p.nargs == -1 for p in arguments):
        problems.append(f"{words[0]}: unexpected argument(s) {extra}")
    spellings = _spelling_checks()
    for param in command.params:
        value = values.get(param.name)
        if value is None or not (isinstance(param.type, click.Choice) or param.name in spellings):
            continue
        for one in value if isinstance(value, (list, tuple)) else [value]:
            try:
                if isinstance(param.type, click.Choice):
                    param.type.convert(one, param, context)
                else:
                    spellings[param.name](one)
            except click.BadParameter as e:
                problems.append(f"{words[0]}: {e.format_message()}")
            except AnimaError as e:
                problems.append(f"{words[0]}: {param.opts[0]}: {e}")
    return problems
