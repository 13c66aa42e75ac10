"""Every relative link and anchor in README.md and docs/**/*.md resolves, as GitHub renders them; and the
checker finds a broken one."""

from pathlib import Path

from doc_pages import ROOT, anchors, link_problems, pages, slug


def test_every_link_and_anchor_resolves():
    assert len(pages()) > 20
    problems = link_problems()
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_github_anchors():
    assert slug("`anima-rknn serve`: an HTTP server") == "anima-rknn-serve-an-http-server"
    assert slug("`--cache auto`: a cache that checks itself") == "--cache-auto-a-cache-that-checks-itself"
    assert slug("On the board: a fresh ROCK 5C") == "on-the-board-a-fresh-rock-5c"
    assert slug("The [flag](x.md) and **`verify=1`**") == "the-flag-and-verify1"
    text = "# A\n\n```\n# not a heading\n```\n\n## Two\n\n## Two\n"
    assert anchors(text) == {"a", "two", "two-1"}


def test_the_checker_finds_a_broken_link_and_anchor(tmp_path: Path):
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "sub" / "page.md").write_text("# Page\n\n## The part `x`\n", encoding="utf-8")
    (tmp_path / "docs" / "plot.png").write_bytes(b"")
    (tmp_path / "README.md").write_text(
        "# R\n\n[good](docs/sub/page.md#the-part-x) ![plot](docs/plot.png) [web](https://example.com/#x)\n"
        "[self](#r) `[not a link](gone.md)`\n\n```\n[in code](gone.md)\n```\n"
        "[gone](docs/gone.md) [bad anchor](docs/sub/page.md#the-part)\n[bad self](#nothing)\n",
        encoding="utf-8")
    assert link_problems(tmp_path) == [
        "README.md:9: no such file: docs/gone.md",
        "README.md:9: docs/sub/page.md has no heading for #the-part",
        "README.md:10: README.md has no heading for #nothing"]
    assert link_problems(tmp_path, [tmp_path / "docs" / "sub" / "page.md"]) == []
    assert ROOT.joinpath("README.md").is_file()
