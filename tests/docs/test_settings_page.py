"""The table of settings in docs/settings.md is the one anima_rknn.generation.params makes (settings_markdown), under
its heading: a setting added, renamed or re-ranged in the code and not in the page fails here."""

from anima_rknn.generation.params import settings_markdown
from doc_pages import ROOT

PAGE = ROOT / "docs" / "settings.md"
HEADING = "## The table of settings"


def settings_table_problem(text: str) -> str | None:
    """What is wrong with a page's table of settings, or None."""
    if HEADING not in text:
        return f"docs/settings.md: no section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    if settings_markdown() not in section:
        return ("docs/settings.md's table of settings is stale: paste "
                "anima_rknn.generation.params.settings_markdown() under " + repr(HEADING))
    return None


def test_the_settings_page_holds_the_table():
    assert settings_table_problem(PAGE.read_text(encoding="utf-8")) is None


def test_the_check_fails_on_a_stale_table():
    text = PAGE.read_text(encoding="utf-8")
    row = next(line for line in settings_markdown().splitlines() if line.startswith("| steps |"))
    assert "stale" in settings_table_problem(text.replace(row, row.replace("1 .. 1000", "1 .. 999")))
    assert "stale" in settings_table_problem(text.replace(row + "\n", ""))
    assert "no section" in settings_table_problem(text.replace(HEADING, "## Settings"))
    moved = text.replace(settings_markdown(), "") + "\n## Elsewhere\n\n" + settings_markdown() + "\n"
    assert "stale" in settings_table_problem(moved)
